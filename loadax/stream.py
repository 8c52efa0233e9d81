"""Streams: `filter` and `pack` change how many records make a batch, so they are not random-access.

A stream reads the records of a random-access dataset in plan order and passes them through its
ops one window at a time. Each data shard has a stream of its own: with `shards` data shards,
shard `s` reads positions s, s + shards, s + 2 * shards, ... of the plan's record order (epochs
back to back). Window `k` of a shard is its positions [k * window, (k + 1) * window); what a window
yields depends on nothing else, so windows load in parallel, locally or on any worker, and a
loader cuts batches from their outputs in order. The order is deterministic for a fixed number
of data shards; changing it changes the batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic

import numpy as np
from typing_extensions import TypeVar

from loadax.errors import RecordError
from loadax.packing import FirstFitPacker, PackedRow
from loadax.permutation import IndexArray
from loadax.plan import Plan
from loadax.validation import require_int

if TYPE_CHECKING:
    from loadax.dataset import Dataset

T = TypeVar("T", default=Any)
U = TypeVar("U", default=Any)

DEFAULT_WINDOW = 256
"""Records per window: each window is one unit of work, locally or on a worker."""

MAX_POSITION = 2**62
"""Positions of a plan's record order fit in int64 with room to spare."""

Origins = list[tuple[int, int]] | None
"""(record index, epoch) of each item of a window, while items are still single records."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamWindow:
    """Window `index` of the stream of data shard `shard` of `shards`.

    >>> from loadax import Plan
    >>> from loadax.stream import StreamWindow, window_positions
    >>> window = StreamWindow(shards=2, shard=1, index=0)
    >>> window_positions(Plan(num_records=10, batch_size=2), 4, window).tolist()
    [1, 3, 5, 7]
    """

    shards: int
    shard: int
    index: int

    def __post_init__(self) -> None:
        require_int("shards", self.shards, minimum=1)
        require_int("index", self.index, minimum=0)
        shard = require_int("shard", self.shard, minimum=0)
        if shard >= self.shards:
            raise ValueError(f"shard must be < shards ({self.shards}), got {shard}")


def shard_length(plan: Plan, shards: int, shard: int) -> int | None:
    """How many positions the stream of `shard` has; None when the plan repeats forever."""
    if plan.num_epochs is None and plan.num_records:
        return None
    total = plan.num_records * (plan.num_epochs or 0)
    return max(0, -(-(total - shard) // shards))


def window_positions(plan: Plan, window_size: int, window: StreamWindow) -> IndexArray:
    """The positions in the plan's record order (epochs back to back) that `window` reads."""
    first = window.index * window_size
    length = shard_length(plan, window.shards, window.shard)
    last = first + window_size if length is None else min(first + window_size, length)
    if first >= last:
        raise IndexError(
            f"window {window.index} of shard {window.shard} is beyond the end of its stream "
            f"({length} records, windows of {window_size})"
        )
    if last * window.shards >= MAX_POSITION:
        raise IndexError(
            f"window {window.index} of shard {window.shard} of {window.shards} lies beyond "
            f"position 2**62 of the plan, more than loadax can address"
        )
    return np.arange(first, last, dtype=np.int64) * window.shards + window.shard


class Stream(Generic[T]):
    """The records of `dataset` in plan order, passed through stream ops, `window` at a time.

    `InMemoryDataset(texts).map(tokenize).filter(lambda t: len(t) > 2).pack(128)` is a stream;
    a loader batches it by stacking rows (the default `Batcher()`).

    >>> from loadax import Batcher, DataLoader, Stream
    >>> stream = Stream(["a", "bb", "ccc", "dddd"]).map(len).filter(lambda n: n > 1)
    >>> [batch.tolist() for batch in DataLoader(Batcher()).batch_size(2).build(stream)]
    [[2, 3], [4]]
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        window: int = DEFAULT_WINDOW,
        ops: Sequence[Callable[[list[Any], Origins], tuple[list[Any], Origins]]] = (),
    ) -> None:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ValueError(
                f"a stream reads a random-access dataset, got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.window = require_int("window", window, minimum=1)
        self.ops = tuple(ops)

    def filter(self, predicate: Callable[[T], bool]) -> Stream[T]:
        """Keep the records for which `predicate` returns True."""
        return self._then(Filter(_callable("predicate", predicate)))

    def map(self, fn: Callable[[T], U]) -> Stream[U]:
        """Apply `fn` to every item of the stream (records, or packed rows)."""
        return self._then(StreamMap(_callable("fn", fn)))

    def pack(
        self, length: int, *, pad_value: int | float = 0, truncate: bool = False
    ) -> Stream[PackedRow]:
        """First-fit pack token sequences into rows of `length`, with segment ids and positions.

        Sequences are packed within each window; see `loadax.packing.FirstFitPacker`.
        """
        return self._then(Pack(FirstFitPacker(length, pad_value, truncate)))

    def apply(self, records: list[Any], origins: Origins) -> list[Any]:
        """What the ops make of the records of one window (`origins` names them in errors)."""
        items: list[Any] = records
        for op in self.ops:
            items, origins = op(items, origins)
        return items

    def __repr__(self) -> str:
        ops = ", ".join(repr(op) for op in self.ops)
        return f"Stream({type(self.dataset).__name__}, window={self.window}, ops=[{ops}])"

    def _then(self, op: Callable[[list[Any], Origins], tuple[list[Any], Origins]]) -> Stream[Any]:
        return Stream(self.dataset, window=self.window, ops=(*self.ops, op))


def _callable(name: str, fn: Any) -> Any:
    if not callable(fn):
        raise ValueError(f"{name} must be callable, got {fn!r}")
    return fn


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", fn))


@dataclasses.dataclass(frozen=True, slots=True)
class Filter:
    """Keeps the items for which `predicate` returns a true bool."""

    predicate: Callable[[Any], bool]

    def __call__(self, items: list[Any], origins: Origins) -> tuple[list[Any], Origins]:
        kept, kept_origins = [], []
        for position, item in enumerate(items):
            verdict = _each(self.predicate, item, position, origins, "filtering")
            if not isinstance(verdict, bool | np.bool_):
                raise _failure(
                    position,
                    origins,
                    TypeError(
                        f"filter predicate {_name(self.predicate)} returned {verdict!r}; "
                        "it must return a bool"
                    ),
                    "filtering",
                )
            if verdict:
                kept.append(item)
                if origins is not None:
                    kept_origins.append(origins[position])
        return kept, None if origins is None else kept_origins

    def __repr__(self) -> str:
        return f"filter({_name(self.predicate)})"


@dataclasses.dataclass(frozen=True, slots=True)
class StreamMap:
    """Applies `fn` to every item."""

    fn: Callable[[Any], Any]

    def __call__(self, items: list[Any], origins: Origins) -> tuple[list[Any], Origins]:
        mapped = [
            _each(self.fn, item, position, origins, "mapping")
            for position, item in enumerate(items)
        ]
        return mapped, origins

    def __repr__(self) -> str:
        return f"map({_name(self.fn)})"


@dataclasses.dataclass(frozen=True, slots=True)
class Pack:
    """Packs the window's sequences into rows; after it, items are rows, not records."""

    packer: FirstFitPacker

    def __call__(self, items: list[Any], origins: Origins) -> tuple[list[Any], Origins]:
        indices = None if origins is None else [index for index, _ in origins]
        return self.packer(items, indices), None

    def __repr__(self) -> str:
        packer = self.packer
        return f"pack({packer.length}, pad_value={packer.pad_value}, truncate={packer.truncate})"


def _each(fn: Callable[[Any], Any], item: Any, position: int, origins: Origins, what: str) -> Any:
    try:
        return fn(item)
    except Exception as error:
        raise _failure(position, origins, error, what) from error


def _failure(position: int, origins: Origins, error: Exception, what: str) -> Exception:
    """An error naming the record (or, after packing, the row) that `error` happened on."""
    if origins is not None:
        index, epoch = origins[position]
        failure = RecordError(index, epoch, error)
        failure.__cause__ = error
        return failure
    error.add_note(f"loadax: while {what} packed row {position} of its window")
    return error
