"""The deterministic shard planner: which global records make the batch of each step.

A plan is pure and holds no state: the indices of step `s` are computed from the plan's
parameters alone, in O(1) memory for any number of records. Batches never span two epochs; the
last batch of an epoch is short unless `drop_remainder` is set. With `shuffle`, every epoch is a
different keyed permutation of the records.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from loadax.plan.blocks import BlockShuffle
from loadax.plan.buckets import LengthBuckets
from loadax.plan.orders import EpochOrder, PlainOrder
from loadax.plan.permutation import IndexArray
from loadax.plan.segments import Position, Segment, checked_changes, segments
from loadax.validation import require_bool, require_int

PLAN_VERSION = 1
"""Bumped whenever a change would alter which records a step gets."""

Rows = slice | npt.ArrayLike
"""Positions within a batch: a slice, or a sequence/array of ints."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """Global record indices of every step for `num_records` records in batches of `batch_size`.

    >>> from loadax import Plan
    >>> plan = Plan(num_records=10, batch_size=4, seed=0, shuffle=True, num_epochs=2)
    >>> plan.num_steps, plan.indices(0).tolist(), plan.indices(3).tolist()
    (6, [9, 8, 6, 0], [3, 8, 6, 0])

    `batch_size_changes` ((step, size) pairs) change the batch size from those steps on: the
    epoch under way continues from its first record not yet delivered, so every record comes
    once per epoch across a change. `buckets` (`LengthBuckets`) make every batch's records come
    from one length bucket; `blocks` (`BlockShuffle`) make `shuffle` shuffle blocks of records
    and the records within windows of them. A plan resumed with a new batch size (`resumed`)
    starts at `first_step`, at `first_position` of its epoch; it has no steps before.

    >>> plan = Plan(num_records=10, batch_size=4, batch_size_changes=((1, 2),))
    >>> [plan.indices(step).tolist() for step in range(plan.num_steps)]
    [[0, 1, 2, 3], [4, 5], [6, 7], [8, 9]]
    """

    num_records: int
    batch_size: int
    seed: int = 0
    shuffle: bool = False
    num_epochs: int | None = 1
    drop_remainder: bool = False
    batch_size_changes: tuple[tuple[int, int], ...] = ()
    buckets: LengthBuckets | None = None
    first_step: int = 0
    first_position: Position | None = None
    blocks: BlockShuffle | None = None
    # Derived once: every step asks for them.
    _order: EpochOrder[Any] = dataclasses.field(init=False, repr=False, compare=False)
    _segments: tuple[Segment, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _firsts: list[int] = dataclasses.field(init=False, repr=False, compare=False)
    _num_steps: int | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, minimum in (
            ("num_records", 0),
            ("batch_size", 1),
            ("seed", 0),
            ("num_epochs", 1),
            ("first_step", 0),
        ):
            value = getattr(self, name)
            if value is not None or name != "num_epochs":
                # Stored normalised, so that numpy ints still describe() as JSON.
                object.__setattr__(self, name, require_int(name, value, minimum=minimum))
        require_bool("shuffle", self.shuffle)
        require_bool("drop_remainder", self.drop_remainder)
        changes = checked_changes(self.batch_size_changes, self.first_step)
        object.__setattr__(self, "batch_size_changes", changes)
        if self.blocks is not None and (not self.shuffle or self.buckets is not None):
            raise ValueError(
                "blocks (a block shuffle) need shuffle=True and no length buckets, got "
                f"shuffle={self.shuffle} and buckets={self.buckets!r}"
            )
        order: EpochOrder[Any]
        if self.buckets is None:
            order = PlainOrder(
                self.num_records, self.seed, self.shuffle, self.drop_remainder, self.blocks
            )
        else:
            order = self.buckets.order(
                self.num_records, self.seed, self.shuffle, self.drop_remainder
            )
        object.__setattr__(self, "_order", order)
        position = self.first_position
        if position is None:
            position = Position(0, order.zero)
        else:
            epoch = require_int("first_position's epoch", position.epoch, minimum=0)
            position = Position(epoch, order.check_cursor(position.cursor))
            object.__setattr__(self, "first_position", position)
        sizes = ((self.first_step, self.batch_size), *self.batch_size_changes)
        parts = segments(order, self.first_step, position, sizes)
        object.__setattr__(self, "_segments", parts)
        object.__setattr__(self, "_firsts", [part.first for part in parts])
        if self.num_epochs is None:
            total = None if parts[-1].per_epoch else parts[-1].first
        else:
            total = self._epoch_start(self.num_epochs)
        object.__setattr__(self, "_num_steps", total)

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one epoch, the short last one included unless `drop_remainder`; only for
        a plan of one batch size from step 0 (else see `epoch_steps`).

        >>> from loadax import Plan
        >>> Plan(10, 4).steps_per_epoch, Plan(10, 4, drop_remainder=True).steps_per_epoch
        (3, 2)
        """
        if len(self._segments) > 1 or self.first_position is not None:
            raise ValueError(
                "a plan whose batch size changes has no fixed number of steps per epoch: "
                "ask epoch_steps(epoch) for an epoch's steps"
            )
        return self._segments[0].per_epoch

    @property
    def num_steps(self) -> int | None:
        """Steps in the whole plan; None when it runs forever.

        >>> from loadax import Plan
        >>> Plan(10, 4, num_epochs=2).num_steps, Plan(10, 4, num_epochs=None).num_steps
        (6, None)
        """
        return self._num_steps

    def epoch(self, step: int) -> int:
        """The epoch that `step` belongs to.

        >>> from loadax import Plan
        >>> [Plan(10, 4, num_epochs=2).epoch(step) for step in range(6)]
        [0, 0, 0, 1, 1, 1]
        """
        step = self._check_step(step)
        return self._segment(step).locate(step)[0]

    def epoch_steps(self, epoch: int) -> range:
        """The steps of `epoch`: its batches, the short last one included unless
        `drop_remainder`. Defined for every epoch, also past `num_epochs` (see `extended_to`).

        >>> from loadax import Plan
        >>> plan = Plan(10, 4, num_epochs=2)
        >>> plan.epoch_steps(0), plan.epoch_steps(1), plan.epoch_steps(5)
        (range(0, 3), range(3, 6), range(15, 18))
        """
        epoch = require_int("epoch", epoch, minimum=0)
        return range(self._epoch_start(epoch), self._epoch_start(epoch + 1))

    def extended_to(self, epoch: int) -> Plan:
        """This plan if it runs `epoch`; else the same plan without an end (`num_epochs=None`).

        A step's records depend on everything but `num_epochs`, which only says where the plan
        ends: both plans give every step they share the same records.

        >>> from loadax import Plan
        >>> plan = Plan(10, 4, seed=1, shuffle=True, num_epochs=2)
        >>> plan.extended_to(1) is plan, plan.extended_to(2).num_epochs
        (True, None)
        >>> three = Plan(10, 4, seed=1, shuffle=True, num_epochs=3)
        >>> [three.indices(step).tolist() for step in (3, 6)]
        [[0, 6, 9, 8], [7, 1, 9, 0]]
        >>> [plan.extended_to(2).indices(step).tolist() for step in (3, 6)]
        [[0, 6, 9, 8], [7, 1, 9, 0]]
        """
        epoch = require_int("epoch", epoch, minimum=0)
        if self.num_epochs is None or epoch < self.num_epochs:
            return self
        return dataclasses.replace(self, num_epochs=None)

    def batch_length(self, step: int) -> int:
        """How many records the batch of `step` has (short only at the end of an epoch).

        >>> from loadax import Plan
        >>> [Plan(10, 4).batch_length(step) for step in range(3)]
        [4, 4, 2]
        """
        step = self._check_step(step)
        segment = self._segment(step)
        epoch, cursor, place = segment.locate(step)
        return self._order.batch_length(epoch, cursor, segment.size, place)

    def indices(self, step: int, rows: Rows | None = None) -> IndexArray:
        """The global record indices of `step`, or of just `rows` (positions in its batch).

        >>> from loadax import Plan
        >>> Plan(10, 4).indices(1).tolist(), Plan(10, 4).indices(1, rows=[0, 3]).tolist()
        ([4, 5, 6, 7], [4, 7])
        """
        step = self._check_step(step)
        segment, order = self._segment(step), self._order
        epoch, cursor, place = segment.locate(step)
        length = order.batch_length(epoch, cursor, segment.size, place)
        return order.records(epoch, cursor, segment.size, place, row_positions(rows, length))

    def batch_size_at(self, step: int) -> int:
        """The batch size the plan gives `step` (its batch is shorter at an epoch's end).

        >>> from loadax import Plan
        >>> plan = Plan(100, 4, batch_size_changes=((2, 8), (5, 16)))
        >>> [plan.batch_size_at(step) for step in (0, 1, 2, 4, 5, 9)]
        [4, 4, 8, 8, 16, 16]
        """
        step = require_int("step", step, minimum=self.first_step)
        size = self.batch_size
        for first, changed in self.batch_size_changes:
            if first > step:
                break
            size = changed
        return size

    def rows_before(self, step: int) -> int:
        """How many rows the steps from `first_step` up to `step` hold at their full batch size
        (a stream's batches, all full but its last), in O(number of changes).

        >>> from loadax import Plan
        >>> Plan(100, 4, batch_size_changes=((2, 8),)).rows_before(5)
        32
        """
        step = require_int("step", step, minimum=self.first_step)
        rows, first, size = 0, self.first_step, self.batch_size
        for changed_at, changed in self.batch_size_changes:
            if changed_at >= step:
                break
            rows, first, size = rows + (changed_at - first) * size, changed_at, changed
        return rows + (step - first) * size

    def batch_lengths(self) -> set[int]:
        """Every length a batch of the plan may have (a sharded loader checks each).

        >>> from loadax import Plan
        >>> sorted(Plan(10, 4).batch_lengths())
        [2, 4]
        >>> sorted(Plan(10, 4, drop_remainder=True).batch_lengths())
        [4]
        """
        lengths: set[int] = set()
        parts, order = self._segments, self._order
        for index, part in enumerate(parts):
            end = parts[index + 1].first if index + 1 < len(parts) else self._num_steps
            if not part.per_epoch or end == part.first:
                continue
            lengths |= order.lengths(part.position.cursor, part.size)
            if end is None or end > part.first + part.left:
                lengths |= order.lengths(order.zero, part.size)
        return lengths

    def position(self, step: int) -> Position:
        """Where `step` starts: its epoch and what of that epoch the steps before delivered (a
        count of records; per bucket with `buckets`). At the plan's end: the next epoch's start.

        >>> from loadax import Plan
        >>> plan = Plan(10, 4, num_epochs=2)
        >>> plan.position(1), plan.position(3), plan.position(6)
        (Position(epoch=0, cursor=4), Position(epoch=1, cursor=0), Position(epoch=2, cursor=0))
        """
        step = require_int("step", step, minimum=self.first_step)
        total = self._num_steps
        if total is not None and step > total:
            raise IndexError(f"step {step} is beyond the plan's {total} steps")
        segment = self._segment(step)
        if not segment.per_epoch:
            return segment.position
        epoch, cursor, place = segment.locate(step)
        return Position(epoch, self._order.advance(epoch, cursor, segment.size, place))

    def resumed(self, step: int, position: Position) -> Plan:
        """This plan's batch sizes from `step` on, continuing another plan's epoch at `position`
        (where that plan's `step` starts): every record of the epoch not yet delivered comes
        once, in the same order, in batches of this plan's size.

        >>> from loadax import Plan
        >>> saved = Plan(10, 4, num_epochs=2)
        >>> plan = Plan(10, 2, num_epochs=2).resumed(1, saved.position(1))
        >>> [plan.indices(step).tolist() for step in range(1, 5)]
        [[4, 5], [6, 7], [8, 9], [0, 1]]
        """
        step = require_int("step", step, minimum=self.first_step)
        changes = tuple(change for change in self.batch_size_changes if change[0] > step)
        return dataclasses.replace(
            self,
            batch_size=self.batch_size_at(step),
            batch_size_changes=changes,
            first_step=step,
            first_position=position,
        )

    def records_at(self, positions: IndexArray) -> tuple[IndexArray, IndexArray]:
        """The record index and epoch at each position of the plan's record order.

        The order is every epoch's records back to back (in their shuffled order with
        `shuffle`), as streams read them; batches play no part in it.

        >>> import numpy as np
        >>> from loadax import Plan
        >>> indices, epochs = Plan(3, 2, num_epochs=2).records_at(np.arange(6))
        >>> indices.tolist(), epochs.tolist()
        ([0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1])
        """
        if self.num_records == 0:
            raise IndexError("a plan over no records has no positions")
        if self.buckets is not None:
            raise TypeError("a length-bucketed plan has batches, not a record order to stream")
        epochs, offsets = np.divmod(positions, self.num_records)
        if not self.shuffle:
            return offsets, epochs
        indices, order = np.empty_like(offsets), cast(PlainOrder, self._order)
        for epoch in np.unique(epochs).tolist():
            chosen = epochs == epoch
            indices[chosen] = order.shuffled(offsets[chosen], epoch)
        return indices, epochs

    def describe(self) -> dict[str, Any]:
        """A JSON-able fingerprint: two plans with equal descriptions yield the same batches.

        >>> from loadax import Plan
        >>> Plan(10, 4).describe()  # doctest: +NORMALIZE_WHITESPACE
        {'version': 1, 'num_records': 10, 'batch_size': 4, 'seed': 0, 'shuffle': False,
         'num_epochs': 1, 'drop_remainder': False}
        """
        described = {"version": PLAN_VERSION, **{name: getattr(self, name) for name in _PLAIN}}
        if self.batch_size_changes:
            described["batch_size_changes"] = [list(change) for change in self.batch_size_changes]
        if self.buckets is not None:
            described["buckets"] = self.buckets.describe()
        if self.blocks is not None:
            described["blocks"] = self.blocks.describe()
        if self.first_position is not None:
            described["start"] = {"step": self.first_step, **self.first_position.describe()}
        return described

    def _check_step(self, step: int) -> int:
        if type(step) is not int or step < 0:  # the common case skips the checked conversion
            step = require_int("step", step, minimum=0)
        if step < self.first_step:
            raise IndexError(
                f"step {step} comes before step {self.first_step}, where this plan was "
                "resumed with a new batch size"
            )
        total = self._num_steps
        if total is not None and step >= total:
            raise IndexError(f"step {step} is beyond the plan's {total} steps")
        return step

    def _segment(self, step: int) -> Segment:
        parts = self._segments
        return parts[0] if len(parts) == 1 else parts[bisect.bisect_right(self._firsts, step) - 1]

    def _epoch_start(self, epoch: int) -> int:
        """The first step in `epoch` or a later one, ignoring where the plan ends."""
        parts = self._segments
        for part, following in itertools.pairwise(parts):
            start = part.epoch_start(epoch)
            if start < following.first:
                return start
        return parts[-1].epoch_start(epoch)


_PLAIN = ("num_records", "batch_size", "seed", "shuffle", "num_epochs", "drop_remainder")


def row_positions(rows: Rows | None, length: int) -> IndexArray:
    """The positions `rows` names in a batch of `length` rows (None: all), checked."""
    if rows is None:
        return np.arange(length, dtype=np.int64)
    if isinstance(rows, slice):
        start, stop, stride = rows.indices(length)
        return np.arange(start, stop, stride, dtype=np.int64)
    positions = np.asarray(rows)
    if positions.ndim != 1 or not (
        positions.size == 0 or np.issubdtype(positions.dtype, np.integer)
    ):
        raise ValueError(f"rows must be a slice or a 1-D sequence of ints, got {rows!r}")
    if positions.size and (positions.min() < 0 or positions.max() >= length):
        raise IndexError(f"rows {positions.tolist()} fall outside the batch of {length} rows")
    return positions.astype(np.int64)
