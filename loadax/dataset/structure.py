"""The ops that rearrange records without touching them: a slice, a concatenation, a repetition.

Each is the index arithmetic of its op, as `Records`; `loadax.dataset.ops` makes it chainable
(`SlicedDataset`, `ConcatenatedDataset`, `RepeatedDataset`), where `DatasetBase`'s methods make
them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeVar

from loadax.dataset.names import chains, dataset_repr, op_repr
from loadax.dataset.protocol import (
    Dataset,
    ReadsRows,
    as_dataset,
    as_datasets,
    dataset_length,
    dataset_lengths,
    reads_rows,
)
from loadax.dataset.records import Records, read_grouped, read_records
from loadax.plan.permutation import IndexArray
from loadax.validation import require_int

T = TypeVar("T", default=Any)


def _optional_int(name: str, value: int | None) -> int | None:
    return None if value is None else require_int(name, value)


class SlicedRecords(Records[T]):
    """`dataset[start:stop:step]` with Python's slicing rules, read in one batched call."""

    def __init__(
        self,
        dataset: Dataset[T],
        start: int | None = None,
        stop: int | None = None,
        step: int | None = None,
    ) -> None:
        bounds = slice(
            _optional_int("start", start), _optional_int("stop", stop), _optional_int("step", step)
        )
        if bounds.step == 0:
            raise ValueError("step must not be zero")
        self._dataset = as_dataset(dataset)
        self._range = range(dataset_length(self._dataset))[bounds]

    def __len__(self) -> int:
        return len(self._range)

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        return read_records(self._dataset, self._parent(indices), epoch)

    @property
    def reads_rows(self) -> bool:
        return reads_rows(self._dataset)

    def read_rows(self, indices: IndexArray, epoch: int) -> npt.NDArray[Any]:
        return cast(ReadsRows, self._dataset).read_rows(self._parent(indices), epoch)

    def _parent(self, indices: IndexArray) -> IndexArray:
        parent = self._range.start + indices * self._range.step
        return parent.astype(np.int64, copy=False)

    def __repr__(self) -> str:
        # The bounds resolved against the parent's length; a stop before 0 is "to the start".
        bounds = self._range
        stop = None if bounds.stop < 0 else bounds.stop
        arguments = f"{bounds.start}, {stop}" + ("" if bounds.step == 1 else f", {bounds.step}")
        return op_repr(self._dataset, "slice", "SlicedDataset", arguments)

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return (self._dataset,)


class ConcatenatedRecords(Records[T]):
    """The records of each of `datasets` in turn; each dataset is read once per batched read."""

    def __init__(self, datasets: Iterable[Dataset[T]]) -> None:
        self._datasets = as_datasets(datasets)
        lengths = dataset_lengths(self._datasets)
        # _ends[d] is one past the last global index of dataset d.
        self._ends = np.cumsum(np.array(lengths, dtype=np.int64))
        self._starts = self._ends - np.array(lengths, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1])

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        owners = np.searchsorted(self._ends, indices, side="right")
        local = indices - self._starts[owners]
        return read_grouped(
            owners, lambda owner, chosen: read_records(self._datasets[owner], local[chosen], epoch)
        )

    def __repr__(self) -> str:
        first, *others = self._datasets
        if others and chains(first, "concatenate"):
            return f"{first!r}.concatenate({', '.join(map(dataset_repr, others))})"
        return f"ConcatenatedDataset([{', '.join(map(dataset_repr, self._datasets))}])"

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return self._datasets


class RepeatedRecords(Records[T]):
    """`dataset` `count` times over; pass p of epoch e reads `dataset` as epoch e * count + p."""

    def __init__(self, dataset: Dataset[T], count: int) -> None:
        self._dataset = as_dataset(dataset)
        self._length = dataset_length(self._dataset)
        self._count = require_int("count", count, minimum=1)

    def __len__(self) -> int:
        return self._length * self._count

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        passes, local = np.divmod(indices, self._length)
        return read_grouped(
            passes,
            lambda repeat, chosen: read_records(
                self._dataset, local[chosen], epoch * self._count + repeat
            ),
        )

    def __repr__(self) -> str:
        return op_repr(self._dataset, "repeat", "RepeatedDataset", str(self._count))

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return (self._dataset,)
