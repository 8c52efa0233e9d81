"""A pipeline is a dataset (or a stream) and a batcher, and the pure steps that load its work.

`run(plan, work)` makes what a work item asks for: the rows of a step's batch for a random-access
dataset, or the stacked rows one window of a stream yields (None when nothing survives it).
Executors split it into `records`, `read_at` and `finish` to spread the reads over threads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, NoReturn, cast

import numpy as np
from typing_extensions import TypeVar

from loadax.collate.batcher import Batcher, stack
from loadax.dataset.protocol import Dataset, ReadsRows, as_dataset, dataset_length, reads_rows
from loadax.dataset.records import read_records, will_read
from loadax.dataset.stream import Stream
from loadax.errors import RecordError, StorageError
from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan, Rows, row_positions
from loadax.plan.work import ListedWork, StepWork, Work

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)


@dataclasses.dataclass(frozen=True, slots=True)
class Pipeline(Generic[T, B]):
    """What a batch is made of: records of `dataset` (or items of a stream), collated by `batcher`.

    A stream's batches are cut from the stacked rows of its windows, so a stream needs the
    default stacking `Batcher()`.

    >>> from loadax import Batcher, Pipeline, Plan, RangeDataset
    >>> pipeline = Pipeline(RangeDataset(0, 10), Batcher())
    >>> plan = Plan(num_records=10, batch_size=4)
    >>> pipeline.load(plan, step=1).tolist(), pipeline.load(plan, 1, rows=slice(2, 4)).tolist()
    ([4, 5, 6, 7], [6, 7])
    """

    dataset: Dataset[T] | Stream[T]
    batcher: Batcher[T, B]
    # Decided once: every batch asks.
    _reads_rows: bool = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.stream is not None and not self.batcher.stacks:
            raise ValueError(
                f"a stream (filter, pack) is batched by stacking its rows: use Batcher(), got "
                f"{self.batcher!r}; apply per-record work with .map() instead"
            )
        if not isinstance(self.dataset, Stream):
            object.__setattr__(self, "dataset", as_dataset(self.dataset))
        dataset_length(self.records)
        rows = self.stream is None and self.batcher.stacks and reads_rows(self.records)
        object.__setattr__(self, "_reads_rows", rows)

    @property
    def stream(self) -> Stream[T] | None:
        """The stream, when the pipeline filters or packs; None for a random-access dataset."""
        return self.dataset if isinstance(self.dataset, Stream) else None

    @property
    def window(self) -> int:
        """Records per window of the stream; 0 for a random-access dataset."""
        return 0 if self.stream is None else self.stream.window

    @property
    def records(self) -> Dataset[Any]:
        """The random-access dataset the records are read from."""
        return self.dataset.dataset if isinstance(self.dataset, Stream) else self.dataset

    @property
    def num_records(self) -> int:
        return dataset_length(self.records)

    @property
    def reads_rows(self) -> bool:
        """True when a batch is one array read of the records (`ReadsRows`)."""
        return self._reads_rows

    def require_kind(self, work: Work) -> None:
        """A TypeError unless `work` is of this pipeline's kind (windows for a stream)."""
        if work.streams and self.stream is None:
            raise TypeError("the pipeline is random-access: ask for steps, not windows")
        if not work.streams and self.stream is not None:
            raise TypeError("the pipeline is a stream (filter, pack): ask for windows")

    def load(self, plan: Plan, step: int, rows: Rows | None = None) -> B:
        """The batch (or the `rows` of it) that `plan` assigns to `step`."""
        positions = None if rows is None else row_positions(rows, plan.batch_length(step))
        return cast(B, self.run(plan, StepWork(step, positions)))

    def run(self, plan: Plan, work: Work) -> Any:
        """What `work` yields: a batch, or a window's stacked rows (None when none survive)."""
        if self._reads_rows and isinstance(work, StepWork | ListedWork):
            # The hot path of array sources: one read, a few microseconds a batch.
            indices, epoch = work.batch(plan)
            try:
                return cast(ReadsRows, self.records).read_rows(indices, epoch)
            except Exception as error:
                self._raise_named(indices, epoch, error)
        indices, epochs = self.positions(plan, work)
        return self.finish(self.read_at(indices, epochs), indices, epochs, work)

    def positions(self, plan: Plan, work: Work) -> tuple[IndexArray, IndexArray]:
        """The record indices `work` reads, in order, and the epoch of each; for a step of a
        block shuffle, the dataset is told the windows it reads and the next one."""
        self.require_kind(work)
        if isinstance(work, StepWork):
            for starts, stops in work.windows(plan):
                will_read(self.records, starts, stops)
        return work.records(plan, self.window)

    def read(self, indices: IndexArray, epoch: int) -> list[Any]:
        """The records at `indices`; a failure names the record that caused it."""
        try:
            return read_records(self.records, indices, epoch)
        except Exception as error:
            self._raise_named(indices, epoch, error)

    def read_at(self, indices: IndexArray, epochs: IndexArray) -> list[Any]:
        """The records at `indices`, each read in its own epoch (`epochs` never decreases)."""
        starts = np.flatnonzero(np.diff(epochs)) + 1
        records: list[Any] = []
        for part, part_epochs in zip(
            np.split(indices, starts), np.split(epochs, starts), strict=True
        ):
            if part.size:
                records.extend(self.read(part, int(part_epochs[0])))
        return records

    def finish(
        self, records: list[Any], indices: IndexArray, epochs: IndexArray, work: Work
    ) -> Any:
        """The batch `work`'s records make: collated, or passed through the stream's ops and
        stacked (None when no row survives)."""
        stream = self.stream
        try:
            if stream is None:
                return self.batcher(records)
            origins = list(zip(indices.tolist(), epochs.tolist(), strict=True))
            rows = stream.apply(records, origins)
            return stack(rows) if rows else None
        except Exception as error:
            error.add_note(f"loadax: {'while collating' if stream is None else 'in'} {work}")
            raise

    def _raise_named(self, indices: IndexArray, epoch: int, error: Exception) -> NoReturn:
        """Raise for a failed read of `indices` together (`error`): a RecordError for the first
        record that fails on its own, else `error` with a note (never a slower retry that hides
        it). A StorageError is the store's failure, already retried: raised as itself."""
        if isinstance(error, StorageError):
            raise error
        # A batched read does not say which record failed: find it one record at a time.
        for position, index in enumerate(indices.tolist()):
            try:
                read_records(self.records, indices[position : position + 1], epoch)
            except StorageError:
                raise
            except Exception as cause:
                raise RecordError(index, epoch, cause) from cause
        error.add_note(
            f"loadax: while reading records {indices.tolist()} (epoch {epoch}) together; "
            "each of them reads without error on its own"
        )
        raise error
