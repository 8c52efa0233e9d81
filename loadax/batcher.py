"""Collation: a `Batcher` turns the list of records of one batch into the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, overload

import jax
import numpy as np
from typing_extensions import TypeVar

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)


def stack(records: list[Any]) -> Any:
    """Stack a list of pytrees (dicts, lists, tuples of arrays or scalars) leaf-wise with numpy."""
    if not records:
        raise ValueError("cannot stack an empty list of records")
    first = records[0]
    if isinstance(first, np.ndarray | np.generic | int | float | complex | bool):
        return np.stack(records)
    # jax.tree.map checks that every record has the structure of the first one.
    return jax.tree.map(lambda *leaves: np.stack(leaves), *records)


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

    def __call__(self, records: list[T]) -> B:
        return self._fn(records)

    def __repr__(self) -> str:
        return f"Batcher({getattr(self._fn, '__qualname__', self._fn)!r})"
