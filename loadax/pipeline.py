"""A pipeline is a dataset and a batcher; `load(plan, step, rows)` is the pure execution step."""

from __future__ import annotations

import dataclasses
from typing import Any, Generic

from typing_extensions import TypeVar

from loadax.batcher import Batcher
from loadax.dataset import Dataset, read_records
from loadax.errors import RecordError
from loadax.permutation import IndexArray
from loadax.plan import Plan, Rows

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)


@dataclasses.dataclass(frozen=True, slots=True)
class Pipeline(Generic[T, B]):
    """What a batch is made of: records of `dataset`, collated by `batcher`."""

    dataset: Dataset[T]
    batcher: Batcher[T, B]

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        """The records at `indices`; a failure names the record that caused it."""
        try:
            return read_records(self.dataset, indices, epoch)
        except Exception as batch_error:
            # A batched read does not say which record failed: find it one record at a time.
            for position, index in enumerate(indices.tolist()):
                try:
                    read_records(self.dataset, indices[position : position + 1], epoch)
                except Exception as error:
                    raise RecordError(index, epoch, error) from error
            batch_error.add_note(
                f"loadax: while reading records {indices.tolist()} (epoch {epoch}) together; "
                "each of them reads without error on its own"
            )
            raise

    def collate(self, records: list[T], step: int) -> B:
        try:
            return self.batcher(records)
        except Exception as error:
            error.add_note(f"loadax: while collating the batch of step {step}")
            raise

    def load(self, plan: Plan, step: int, rows: Rows | None = None) -> B:
        """The batch (or the `rows` of it) that `plan` assigns to `step`."""
        records = self.read(plan.indices(step, rows), plan.epoch(step))
        return self.collate(records, step)
