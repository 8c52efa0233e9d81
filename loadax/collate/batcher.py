"""Collation: a `Batcher` turns the list of records of one batch into the batch."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, overload

import jax
import numpy as np
from typing_extensions import TypeVar

from loadax.buffers import BufferPool
from loadax.dataset.names import callable_name

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)


_PLAIN_SCALARS = frozenset({int, float, bool, complex})
POOLED_FROM_BYTES = 1 << 20
"""A stacked leaf of this size or more is made in a buffer of `_LEAF_BUFFERS`, reused once nothing
refers to the batch (a batch held, or a view or jax.Array made from it, keeps its buffer), where a
fresh array would be freshly mapped memory, faulted in page by page. R1's 38.5 MB batches, medians
of 3 alternated runs (`benchmarks/profile_remote.py R1 zmq|local`): the local loader 2.32 -> 3.26
GB/s (0.74 -> 0.52 CPU s/GB), a worker 1.48 -> 1.22 CPU s/GB. Smaller leaves are left to malloc,
which reuses them already."""
SPARE_LEAF_BYTES = 256 << 20
"""The most bytes of free leaf buffers kept for reuse, so that a process that is done loading
batches of hundreds of MiB does not hold them."""
_LEAF_BUFFERS = BufferPool(spare=2, spare_bytes=SPARE_LEAF_BYTES)  # one per large leaf, say


def empty_leaf(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """An uninitialised array for a stacked leaf: from `_LEAF_BUFFERS` from `POOLED_FROM_BYTES`
    (not for Python objects, which numpy keeps only in arrays of its own)."""
    count = math.prod(shape)
    if count * dtype.itemsize < POOLED_FROM_BYTES or dtype.hasobject:
        return np.empty(shape, dtype)
    buffer = _LEAF_BUFFERS.take(count * dtype.itemsize)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def _stacked(column: list[Any]) -> np.ndarray[Any, Any]:
    """`np.stack(column)`, into `empty_leaf` when the leaves are arrays that fill one."""
    first = column[0]
    if isinstance(first, bytes | str):
        _refuse_trailing_nuls(column)
    if len(column) * getattr(first, "nbytes", 0) < POOLED_FROM_BYTES or not all(
        isinstance(leaf, np.ndarray) for leaf in column
    ):
        return np.stack(column)
    dtype = np.result_type(*{leaf.dtype for leaf in column})
    return np.stack(column, out=empty_leaf((len(column), *first.shape), dtype))


def _refuse_trailing_nuls(column: list[Any]) -> None:
    """Bytes or text stack into numpy's fixed-width arrays, which cannot hold a trailing NUL
    (it reads back as padding): a value ending in one is refused, never cut."""
    for row, value in enumerate(column):
        if isinstance(value, bytes | str) and value[-1:] in (b"\x00", "\x00"):
            raise ValueError(
                f"row {row} of the batch is {type(value).__name__} ending in NUL "
                f"(...{value[-8:]!r}): a fixed-width numpy array would drop its trailing NULs; "
                "keep such values in a list (Batcher(list)) or make them arrays in a .map "
                "(e.g. np.frombuffer)"
            )


def stack(records: list[Any]) -> Any:
    """Stack a list of pytrees (dicts, lists, tuples of arrays or scalars) leaf-wise with numpy.

    >>> import numpy as np
    >>> from loadax import stack
    >>> batch = stack([{"x": np.zeros(2), "y": 1}, {"x": np.ones(2), "y": 2}])
    >>> batch["x"].tolist(), batch["y"].tolist()
    ([[0.0, 0.0], [1.0, 1.0]], [1, 2])
    """
    if not records:
        raise ValueError("cannot stack an empty list of records")
    if all(type(record) in _PLAIN_SCALARS for record in records):
        return np.array(records)  # what stacking them gives, without a pytree walk each
    structure, columns = leaf_columns(records)
    try:
        return jax.tree.unflatten(structure, [_stacked(column) for column in columns])
    except ValueError as error:
        ragged = _ragged_leaf(records[0], columns)
        if ragged is None:
            raise
        raise ValueError(ragged) from error


def leaf_columns(records: list[Any], where: str = "") -> tuple[Any, list[list[Any]]]:
    """The pytree structure shared by `records`, and the column of each of its leaves.

    A record whose structure differs is a ValueError naming it (and `where`, a path inside it).
    """
    structure: Any
    first, structure = jax.tree.flatten(records[0])
    columns: list[list[Any]] = [[leaf] for leaf in first]
    for position, record in enumerate(records[1:], start=1):
        leaves, record_structure = jax.tree.flatten(record)
        if record_structure != structure:
            raise ValueError(
                f"{where + ' of ' if where else ''}record {position} of the batch has structure "
                f"{record_structure}, but record 0 has {structure}"
            )
        for column, leaf in zip(columns, leaves, strict=True):
            column.append(leaf)
    return structure, columns


def _ragged_leaf(first: Any, columns: list[list[Any]]) -> str | None:
    """Which leaf of which record has a shape unlike record 0's, said plainly (None: none)."""
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(first)]
    for path, column in zip(paths, columns, strict=True):
        shapes = [np.shape(value) for value in column]
        for position, shape in enumerate(shapes):
            if shape != shapes[0]:
                return (
                    f"leaf {path or '(the record itself)'} of record {position} has shape "
                    f"{shape}, but record 0's has shape {shapes[0]}; pad ragged leaves with "
                    "loadax.pad_batcher(...)"
                )
    return None


class Batcher(Generic[T, B]):
    """Collates the records of a batch with `fn`; without `fn`, stacks pytrees of arrays.

    >>> from loadax import Batcher
    >>> Batcher()([1, 2, 3]).tolist()
    [1, 2, 3]
    >>> Batcher(sum)([1, 2, 3])
    6
    >>> Batcher(), Batcher(sum)
    (Batcher(), Batcher(sum))
    """

    @overload
    def __init__(self: Batcher[Any, Any]) -> None: ...
    @overload
    def __init__(self, fn: Callable[[list[T]], B]) -> None: ...
    def __init__(self, fn: Callable[[list[T]], B] | None = None) -> None:
        if fn is not None and not callable(fn):
            raise ValueError(f"fn must be callable, got {fn!r}")
        self._fn: Callable[[list[T]], B] = stack if fn is None else fn

    @property
    def stacks(self) -> bool:
        """True for the default batcher, which stacks records leaf-wise."""
        return self._fn is stack

    def __call__(self, records: list[T]) -> B:
        return self._fn(records)

    def __repr__(self) -> str:
        return "Batcher()" if self.stacks else f"Batcher({callable_name(self._fn)})"


LeafKinds = Sequence[tuple[tuple[int, ...], np.dtype[Any]]]
"""The shape and dtype of each leaf of a batch."""


STACKED_BYTES = 512 << 10
"""`SharedStack` copies a part's rows into a leaf of `StackInto` memory this many bytes at a time
(one row at least), and says so after each (`StackInto.stacked`), so that whatever that memory
does with them (e.g. hash them) finds them in the CPU's cache (1 MiB of L2 a core here)."""


class StackInto(Protocol):
    """Memory to stack a batch into, other than this process's own: e.g. the memory file of the
    client a worker's batch is for, so that its bytes are written once."""

    def leaves(self, structure: Any, kinds: LeafKinds) -> list[np.ndarray[Any, Any]] | None:
        """Writable arrays of these `kinds` (shapes, dtypes) for the leaves of a batch of
        `structure` (a pytree's), or None: stack it into this process's memory."""
        ...

    def stacked(self, leaf: int, start: int, stop: int) -> None:
        """Rows `start` to `stop` of leaf `leaf` of the arrays `leaves` gave are final (just
        copied, from any thread; each row once)."""
        ...


class SharedStack:
    """`stack` of a batch read in parts by several threads, each copying its part's rows into
    one shared array per leaf, so that no thread copies the whole batch at the end; the arrays
    are `into`'s if it gives them.

    `place(position, records)` is called once per part (of `sizes[position]` records), from any
    thread. When the parts' leaves do not all share one structure, shape and dtype, `batch()` is
    None: then stack the records with `stack`, which promotes dtypes or names the ragged leaf.

    >>> import numpy as np
    >>> from loadax.collate.batcher import SharedStack
    >>> shared = SharedStack([2, 1])
    >>> shared.place(1, [{"x": np.array([5, 6])}])
    >>> shared.place(0, [{"x": np.array([1, 2])}, {"x": np.array([3, 4])}])
    >>> shared.batch()["x"].tolist()
    [[1, 2], [3, 4], [5, 6]]
    """

    def __init__(self, sizes: list[int], into: StackInto | None = None) -> None:
        self._starts = [0, *itertools.accumulate(sizes)]
        self._into = into
        self._lock = threading.Lock()
        self._layout: tuple[Any, list[tuple[tuple[int, ...], np.dtype[Any]]]] | None = None
        self._leaves: list[np.ndarray[Any, Any]] = []
        self._given: StackInto | None = None  # `into`, once it gave the leaves
        self._mixed = False

    def place(self, position: int, records: list[Any]) -> None:
        """Copy the rows of part `position` into their place in the batch."""
        try:
            structure, columns = leaf_columns(records)
        except ValueError:
            self._mixed = True
            return
        kinds = []
        for column in columns:
            first = np.asarray(column[0])
            kind = (first.shape, first.dtype)
            # Bytes and text go to `stack`, which checks them for trailing NULs.
            if first.dtype.kind in "SU" or any(
                (np.shape(value), np.asarray(value).dtype) != kind for value in column
            ):
                self._mixed = True
                return
            kinds.append(kind)
        with self._lock:
            if self._layout is None:
                self._layout = (structure, kinds)
                rows = self._starts[-1]
                stacked = [((rows, *shape), dtype) for shape, dtype in kinds]
                given = None if self._into is None else self._into.leaves(structure, stacked)
                self._given = None if given is None else self._into
                self._leaves = given or [empty_leaf(*kind) for kind in stacked]
            elif self._layout != (structure, kinds):
                self._mixed = True
            if self._mixed:
                return
        start, stop = self._starts[position], self._starts[position + 1]
        into = self._given
        for index, (column, leaf) in enumerate(zip(columns, self._leaves, strict=True)):
            if into is None:
                np.stack(column, out=leaf[start:stop])
                continue
            rows = max(1, STACKED_BYTES // max(1, leaf[0].nbytes))
            for low in range(0, stop - start, rows):
                high = min(low + rows, stop - start)
                np.stack(column[low:high], out=leaf[start + low : start + high])
                into.stacked(index, start + low, start + high)

    def batch(self) -> Any | None:
        """The stacked batch, once every part is placed; None if the parts did not match."""
        if self._mixed or self._layout is None:
            return None
        return jax.tree.unflatten(self._layout[0], self._leaves)
