"""Collation: a `Batcher` turns the list of records of one batch into the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, overload

import jax
import numpy as np
from typing_extensions import TypeVar

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)


_PLAIN_SCALARS = frozenset({int, float, bool, complex})


def stack(records: list[Any]) -> Any:
    """Stack a list of pytrees (dicts, lists, tuples of arrays or scalars) leaf-wise with numpy."""
    if not records:
        raise ValueError("cannot stack an empty list of records")
    if all(type(record) in _PLAIN_SCALARS for record in records):
        return np.array(records)  # what stacking them gives, without a pytree walk each
    structure, columns = leaf_columns(records)
    try:
        return jax.tree.unflatten(structure, [np.stack(column) for column in columns])
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
    """Collates the records of a batch with `fn`; without `fn`, stacks pytrees of arrays."""

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
        return f"Batcher({getattr(self._fn, '__qualname__', self._fn)!r})"
