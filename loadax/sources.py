"""Record sources that live in the process: a wrapped sequence or array, and a range of ints."""

from __future__ import annotations

from typing import Any

import numpy as np
from typing_extensions import TypeVar

from loadax.dataset import Dataset, DatasetBase, dataset_length, read_records
from loadax.permutation import IndexArray
from loadax.validation import require_int

T = TypeVar("T", default=Any)


class InMemoryDataset(DatasetBase[T]):
    """A sequence, numpy array or any other random-access source, wrapped without copying."""

    def __init__(self, items: Dataset[T]) -> None:
        self._items, self._length = items, dataset_length(items)

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        if isinstance(self._items, np.ndarray):
            return list(self._items[indices])
        return read_records(self._items, indices, epoch)


class RangeDataset(DatasetBase[int]):
    """The ints of `range(start, stop, step)`; O(1) memory for any length."""

    def __init__(self, start: int, stop: int, step: int = 1) -> None:
        start = require_int("start", start)
        stop = require_int("stop", stop)
        step = require_int("step", step)
        if step == 0:
            raise ValueError("step must not be zero")
        self._range = range(start, stop, step)

    def __len__(self) -> int:
        return len(self._range)

    def read(self, indices: IndexArray, epoch: int) -> list[int]:
        return [self._range[index] for index in indices.tolist()]

    def __repr__(self) -> str:
        return f"RangeDataset({self._range.start}, {self._range.stop}, {self._range.step})"
