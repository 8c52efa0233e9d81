"""Record sources that live in the process: a wrapped sequence or array, and a range of ints."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeVar

from loadax.dataset.names import short_repr
from loadax.dataset.ops import DatasetBase
from loadax.dataset.protocol import Dataset, dataset_length
from loadax.dataset.records import read_records
from loadax.plan.permutation import IndexArray
from loadax.validation import require_int

T = TypeVar("T", default=Any)


class InMemoryDataset(DatasetBase[T]):
    """A sequence, numpy array or any other random-access source, wrapped without copying.

    >>> import numpy as np
    >>> from loadax import InMemoryDataset
    >>> rows = InMemoryDataset(np.arange(6).reshape(3, 2))
    >>> len(rows), rows[-1].tolist(), [row.tolist() for row in rows.shuffle(seed=0)]
    (3, [4, 5], [[4, 5], [0, 1], [2, 3]])
    """

    def __init__(self, items: Dataset[T]) -> None:
        self._items, self._length = items, dataset_length(items)

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        if isinstance(self._items, np.ndarray):
            return list(self._items[indices])
        return read_records(self._items, indices, epoch)

    @property
    def reads_rows(self) -> bool:
        return isinstance(self._items, np.ndarray)

    def read_rows(self, indices: IndexArray, epoch: int) -> npt.NDArray[Any]:
        if not isinstance(self._items, np.ndarray):
            raise TypeError(f"{type(self._items).__name__} records are not the rows of an array")
        return self._items[indices]

    def __repr__(self) -> str:
        return f"InMemoryDataset({short_repr(self._items)})"


class RangeDataset(DatasetBase[int]):
    """The ints of `range(start, stop, step)`; O(1) memory for any length.

    >>> from loadax import RangeDataset
    >>> numbers = RangeDataset(0, 10, 3)
    >>> len(numbers), list(numbers), len(RangeDataset(0, 10**18))
    (4, [0, 3, 6, 9], 1000000000000000000)
    """

    def __init__(self, start: int, stop: int, step: int = 1) -> None:
        start = require_int("start", start)
        stop = require_int("stop", stop)
        step = require_int("step", step)
        if step == 0:
            raise ValueError("step must not be zero")
        self._range = range(start, stop, step)
        # Stacked Python ints are int64: rows are readable only while every int fits in one.
        first, last = (self._range[0], self._range[-1]) if self._range else (0, 0)
        self._fits_int64 = all(-(2**63) <= v < 2**63 for v in (first, last, abs(last - first)))

    def __len__(self) -> int:
        return len(self._range)

    def read(self, indices: IndexArray, epoch: int) -> list[int]:
        return [self._range[index] for index in indices.tolist()]

    @property
    def reads_rows(self) -> bool:
        return self._fits_int64

    def read_rows(self, indices: IndexArray, epoch: int) -> npt.NDArray[Any]:
        if not self.reads_rows:
            raise TypeError(f"{self!r} holds ints beyond int64: not the rows of an array")
        return self._range.start + indices * self._range.step

    def __repr__(self) -> str:
        bounds = self._range
        step = "" if bounds.step == 1 else f", {bounds.step}"
        return f"RangeDataset({bounds.start}, {bounds.stop}{step})"
