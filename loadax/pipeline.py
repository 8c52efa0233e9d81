"""A pipeline is a dataset (or a stream) and a batcher, and the pure execution steps over them.

`load(plan, step, rows)` makes a batch of a random-access dataset; `load_window(plan, window)`
makes the rows that one window of a stream yields, stacked (None when nothing survives it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, cast

import numpy as np
from typing_extensions import TypeVar

from loadax.batcher import Batcher, stack
from loadax.dataset import Dataset, dataset_length, read_records, read_rows, rows_readable
from loadax.errors import RecordError
from loadax.permutation import IndexArray
from loadax.plan import Plan, Rows
from loadax.stream import Stream, StreamWindow, window_positions

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
        dataset_length(self.records)
        reads_rows = self.stream is None and self.batcher.stacks and rows_readable(self.records)
        object.__setattr__(self, "_reads_rows", reads_rows)

    @property
    def stream(self) -> Stream[T] | None:
        """The stream, when the pipeline filters or packs; None for a random-access dataset."""
        return self.dataset if isinstance(self.dataset, Stream) else None

    @property
    def records(self) -> Dataset[Any]:
        """The random-access dataset the records are read from."""
        return self.dataset.dataset if isinstance(self.dataset, Stream) else self.dataset

    @property
    def num_records(self) -> int:
        return dataset_length(self.records)

    def read(self, indices: IndexArray, epoch: int) -> list[Any]:
        """The records at `indices`; a failure names the record that caused it."""
        try:
            return read_records(self.records, indices, epoch)
        except Exception as batch_error:
            # A batched read does not say which record failed: find it one record at a time.
            for position, index in enumerate(indices.tolist()):
                try:
                    read_records(self.records, indices[position : position + 1], epoch)
                except Exception as error:
                    raise RecordError(index, epoch, error) from error
            batch_error.add_note(
                f"loadax: while reading records {indices.tolist()} (epoch {epoch}) together; "
                "each of them reads without error on its own"
            )
            raise

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

    def collate(self, records: list[T], step: int) -> B:
        try:
            return self.batcher(records)
        except Exception as error:
            error.add_note(f"loadax: while collating the batch of step {step}")
            raise

    @property
    def reads_rows(self) -> bool:
        """True when a batch is one array read of the records (`DatasetBase.read_rows`)."""
        return self._reads_rows

    def load(self, plan: Plan, step: int, rows: Rows | None = None) -> B:
        """The batch (or the `rows` of it) that `plan` assigns to `step`."""
        indices, epoch = plan.indices(step, rows), plan.epoch(step)
        if self.reads_rows:
            try:
                return cast(B, read_rows(self.records, indices, epoch))
            except Exception:  # read record by record below, to name the failing one
                pass
        return self.collate(self.read(indices, epoch), step)

    def window_records(self, plan: Plan, window: StreamWindow) -> tuple[IndexArray, IndexArray]:
        """The record indices and epochs that `window` of the stream reads, in order."""
        stream = self._require_stream()
        return plan.records_at(window_positions(plan, stream.window, window))

    def finish_window(
        self, records: list[Any], indices: IndexArray, epochs: IndexArray, window: StreamWindow
    ) -> Any:
        """The stacked rows the stream's ops make of a window's records; None if there are none."""
        stream = self._require_stream()
        origins = list(zip(indices.tolist(), epochs.tolist(), strict=True))
        try:
            rows = stream.apply(records, origins)
            return stack(rows) if rows else None
        except Exception as error:
            error.add_note(
                f"loadax: in window {window.index} of data shard {window.shard} of {window.shards}"
            )
            raise

    def load_window(self, plan: Plan, window: StreamWindow) -> Any:
        """The rows that `window` of the stream yields, stacked; None when none survive."""
        indices, epochs = self.window_records(plan, window)
        return self.finish_window(self.read_at(indices, epochs), indices, epochs, window)

    def _require_stream(self) -> Stream[T]:
        if self.stream is None:
            raise ValueError("this pipeline's dataset is random-access, not a stream")
        return self.stream
