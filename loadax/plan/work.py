"""Work items: what a loader asks an executor to load, locally or on a worker.

There are three kinds of one type: the rows of one step's batch (`StepWork`) for a random-access
pipeline, the same rows with their records named (`ListedWork`) for a plan a worker cannot
compute, and one window of a data shard's stream (`StreamWindow`) for a stream. A work item names
itself in errors, says which records it reads (and in which epoch), and is checked here, once,
wherever it came from; `loadax.wire.plans` carries it to and from the wire.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, cast

import numpy as np

from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan, row_positions
from loadax.validation import require_int

MAX_POSITION = 2**62
"""Positions of a plan's record order fit in int64 with room to spare."""


class Work(abc.ABC):
    """One unit of loading: it reads some records of a plan and yields one piece of a batch."""

    __slots__ = ()

    streams: ClassVar[bool]
    """True for the windows of a stream, False for the batches of a random-access pipeline."""

    @property
    @abc.abstractmethod
    def ordinal(self) -> int:
        """A number that orders work of one kind: placement spreads consecutive ordinals."""

    @abc.abstractmethod
    def check(self, plan: Plan, window_size: int) -> int:
        """How many records the work reads; ValueError if it is malformed, IndexError if it
        lies beyond the plan. `window_size` is the stream's (0 for a random-access pipeline)."""

    @abc.abstractmethod
    def records(self, plan: Plan, window_size: int) -> tuple[IndexArray, IndexArray]:
        """The record indices the work reads, in order, and the epoch each is read in."""


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class StepWork(Work):
    """The `rows` (positions in the batch; None: all of them) of the batch of `step`.

    >>> from loadax import Plan
    >>> from loadax.plan.work import StepWork
    >>> work = StepWork(1, np.array([0, 2]))
    >>> str(work), work.records(Plan(num_records=10, batch_size=4), 0)[0].tolist()
    ('the batch of step 1', [4, 6])
    """

    streams: ClassVar[bool] = False
    step: int
    rows: IndexArray | None = None

    def __post_init__(self) -> None:
        if type(self.step) is not int or self.step < 0:  # the common case skips the conversion
            object.__setattr__(self, "step", require_int("step", self.step, minimum=0))

    @property
    def ordinal(self) -> int:
        return self.step

    def check(self, plan: Plan, window_size: int) -> int:
        length = plan.batch_length(self.step)
        try:
            return int(row_positions(self.rows, length).size)
        except IndexError as error:  # the step is in the plan: the rows are malformed
            raise ValueError(str(error)) from None

    def records(self, plan: Plan, window_size: int) -> tuple[IndexArray, IndexArray]:
        indices, epoch = self.batch(plan)
        # Not int64: the epochs of a plan that repeats forever may pass 2**63.
        return indices, np.full(indices.size, epoch)

    def batch(self, plan: Plan) -> tuple[IndexArray, int]:
        """The record indices of the rows, and the epoch of their batch."""
        return plan.indices(self.step, self.rows), plan.epoch(self.step)

    def listed(self, plan: Plan) -> ListedWork:
        """The same rows with their records named, for a worker that cannot compute them.

        >>> from loadax import Plan
        >>> listed = StepWork(2).listed(Plan(num_records=10, batch_size=4, num_epochs=2))
        >>> listed.rows.tolist(), listed.indices.tolist(), listed.epoch
        ([0, 1], [8, 9], 0)
        """
        indices, epoch = self.batch(plan)
        rows = row_positions(self.rows, plan.batch_length(self.step))
        return ListedWork(self.step, rows, indices, epoch)

    def windows(self, plan: Plan) -> list[tuple[IndexArray, IndexArray]]:
        """The records of the block shuffle's windows that the step's batch reads, and of the
        window after them, as `BlockShuffle.window_ranges` gives them (none without `blocks`):
        what a source may fetch ahead.

        >>> from loadax import Plan
        >>> from loadax.plan.blocks import BlockShuffle
        >>> plan = Plan(16, 4, shuffle=True, num_epochs=2, blocks=BlockShuffle(4, 2))
        >>> [(starts.tolist(), stops.tolist()) for starts, stops in StepWork(1).windows(plan)]
        [([0, 8], [4, 12]), ([4, 12], [8, 16])]
        """
        blocks = plan.blocks
        if blocks is None:
            return []
        position = plan.position(self.step)
        epoch, first = position.epoch, int(cast(int, position.cursor))
        last = first + plan.batch_length(self.step) - 1
        ends = np.array([first, last], dtype=np.int64)
        windows = blocks.windows(plan.num_records, plan.seed, epoch, ends).tolist()
        wanted = [(epoch, window) for window in range(windows[0], windows[1] + 2)]
        if wanted[-1][1] == blocks.window_count(plan.num_records):  # the next epoch's first
            wanted[-1] = (epoch + 1, 0)
            if plan.num_epochs is not None and epoch + 1 >= plan.num_epochs:
                wanted.pop()
        return [
            blocks.window_ranges(plan.num_records, plan.seed, epoch, window)
            for epoch, window in wanted
        ]

    def __str__(self) -> str:
        return f"the batch of step {self.step}"


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class ListedWork(Work):
    """The `rows` of the batch of `step`, row i reading record `indices[i]` in `epoch`.

    What a worker is asked for a plan it cannot compute: a length-bucketed one, whose lengths
    only the client has. Its batch is the one of the `StepWork` it lists (`StepWork.listed`);
    the plan serves only to check the records against the dataset's length.

    >>> from loadax import Plan
    >>> from loadax.plan.work import ListedWork
    >>> work = ListedWork(5, np.array([0, 1]), np.array([7, 2]), epoch=1)
    >>> work.check(Plan(num_records=8, batch_size=2), 0), work.records(Plan(8, 2), 0)[1].tolist()
    (2, [1, 1])
    >>> work.check(Plan(num_records=4, batch_size=2), 0)
    Traceback (most recent call last):
    ValueError: the batch of step 5 names record 7, beyond the dataset's 4 records
    """

    streams: ClassVar[bool] = False
    step: int
    rows: IndexArray
    indices: IndexArray
    epoch: int

    def __post_init__(self) -> None:
        require_int("step", self.step, minimum=0)
        require_int("epoch", self.epoch, minimum=0)

    @property
    def ordinal(self) -> int:
        return self.step

    def check(self, plan: Plan, window_size: int) -> int:
        indices = self.indices
        if indices.size != self.rows.size:
            raise ValueError(
                f"{self} names {indices.size} records for {self.rows.size} rows: one per row"
            )
        if indices.size and indices.min() < 0:
            raise ValueError(f"{self} names record {int(indices.min())}: indices are >= 0")
        if indices.size and indices.max() >= plan.num_records:
            raise ValueError(
                f"{self} names record {int(indices.max())}, beyond the dataset's "
                f"{plan.num_records} records"
            )
        return int(indices.size)

    def records(self, plan: Plan, window_size: int) -> tuple[IndexArray, IndexArray]:
        return self.indices, np.full(self.indices.size, self.epoch)

    def batch(self, plan: Plan) -> tuple[IndexArray, int]:
        """The record indices of the rows, and the epoch of their batch."""
        return self.indices, self.epoch

    def __str__(self) -> str:
        return f"the batch of step {self.step}"


@dataclasses.dataclass(frozen=True, slots=True)
class StreamWindow(Work):
    """Window `index` of the stream of data shard `shard` of `shards`.

    Shard `s` reads positions s, s + shards, s + 2 * shards, ... of the plan's record order
    (epochs back to back); its window `k` is its positions [k * window_size, (k + 1) * window_size).

    >>> from loadax import Plan
    >>> from loadax.plan.work import StreamWindow, window_positions
    >>> window = StreamWindow(shards=2, shard=1, index=0)
    >>> window_positions(Plan(num_records=10, batch_size=2), 4, window).tolist()
    [1, 3, 5, 7]
    """

    streams: ClassVar[bool] = True
    shards: int
    shard: int
    index: int

    def __post_init__(self) -> None:
        require_int("shards", self.shards, minimum=1)
        require_int("index", self.index, minimum=0)
        shard = require_int("shard", self.shard, minimum=0)
        if shard >= self.shards:
            raise ValueError(f"shard must be < shards ({self.shards}), got {shard}")

    @property
    def ordinal(self) -> int:
        # Consecutive windows of all shards: spread over workers as steps are.
        return self.index * self.shards + self.shard

    def check(self, plan: Plan, window_size: int) -> int:
        return int(window_positions(plan, window_size, self).size)

    def records(self, plan: Plan, window_size: int) -> tuple[IndexArray, IndexArray]:
        return plan.records_at(window_positions(plan, window_size, self))

    def __str__(self) -> str:
        return f"window {self.index} of data shard {self.shard} of {self.shards}"


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
