"""Pipeline: one `run(plan, work)` for steps and windows, and failures that name their record."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loadax import Batcher, InMemoryDataset, Pipeline, Plan, RangeDataset, RecordError
from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.plan.work import StepWork, StreamWindow


class Rows(DatasetBase[Any]):
    """Records that are the rows of an array; `read_rows` fails as the test says."""

    def __init__(self, broken_record: int | None = None, broken_together: bool = False) -> None:
        self._array = np.arange(20).reshape(10, 2)
        self.broken_record, self.broken_together = broken_record, broken_together
        self.row_reads = 0

    def __len__(self) -> int:
        return 10

    def read(self, indices: IndexArray, epoch: int) -> list[Any]:
        if self.broken_record in indices.tolist():
            raise OSError(f"record {self.broken_record} is corrupt")
        return list(self._array[indices])

    @property
    def reads_rows(self) -> bool:
        return True

    def read_rows(self, indices: IndexArray, epoch: int) -> Any:
        self.row_reads += 1
        if self.broken_record in indices.tolist():
            raise OSError(f"record {self.broken_record} is corrupt")
        if self.broken_together and indices.size > 1:
            raise MemoryError("the batched read gave up")
        return self._array[indices]


def test_a_row_read_is_one_call_and_equals_the_stacked_records() -> None:
    dataset = Rows()
    pipeline = Pipeline(dataset, Batcher())
    plan = Plan(10, 4, seed=3, shuffle=True)
    assert pipeline.reads_rows
    batch = pipeline.run(plan, StepWork(1))
    assert dataset.row_reads == 1
    np.testing.assert_array_equal(batch, np.stack(dataset.read(plan.indices(1), 0)))


def test_a_failing_row_read_names_the_record_instead_of_rereading_slowly() -> None:
    pipeline = Pipeline(Rows(broken_record=6), Batcher())
    with pytest.raises(RecordError, match=r"record 6 \(epoch 0\) failed: OSError") as failure:
        pipeline.run(Plan(10, 4), StepWork(1))
    assert failure.value.index == 6


def test_a_row_read_that_fails_only_together_is_raised_not_retried_record_by_record() -> None:
    # Each record reads on its own, so no record is to blame: the batched read's error is
    # raised with a note, never replaced by a silent, slower record-by-record batch.
    pipeline = Pipeline(Rows(broken_together=True), Batcher())
    with pytest.raises(MemoryError, match="gave up") as failure:
        pipeline.run(Plan(10, 4), StepWork(0))
    assert "each of them reads without error on its own" in "\n".join(failure.value.__notes__)


def test_a_window_of_a_stream_runs_through_the_same_entry_point() -> None:
    stream = InMemoryDataset(list(range(10))).filter(lambda x: x % 3 == 0)
    pipeline = Pipeline(stream, Batcher())
    window = StreamWindow(shards=1, shard=0, index=0)
    assert pipeline.run(Plan(10, 2), window).tolist() == [0, 3, 6, 9]


@pytest.mark.parametrize(
    ("dataset", "work", "message"),
    [
        (RangeDataset(0, 4), StreamWindow(1, 0, 0), "random-access: ask for steps"),
        (RangeDataset(0, 4).filter(bool), StepWork(0), "is a stream .* ask for windows"),
    ],
)
def test_work_of_the_other_kind_is_refused(dataset: Any, work: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Pipeline(dataset, Batcher()).run(Plan(4, 2), work)


def test_a_failing_collate_names_the_step() -> None:
    def refuse(records: list[int]) -> Any:
        raise ValueError("no")

    pipeline = Pipeline(RangeDataset(0, 4), Batcher(refuse))
    with pytest.raises(ValueError, match="no") as failure:
        pipeline.load(Plan(4, 2), 1)
    assert "loadax: while collating the batch of step 1" in failure.value.__notes__
