"""The steps of a plan whose batch size changes, as segments of one batch size each.

A segment starts at a step with a batch size and a position (an epoch and the cursor of what of
it is delivered); it finishes that epoch in batches of its size, then runs whole epochs of them
until the next segment starts. Finding a step is a search over the segments and O(1) arithmetic
within one: a plan holds O(number of changes) of them, whatever its length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from loadax.plan.orders import Cursor, EpochOrder
from loadax.validation import require_int


@dataclasses.dataclass(frozen=True, slots=True)
class Position:
    """Where a step starts: the epoch it is in and the cursor of what of it is delivered.

    >>> from loadax.plan.segments import Position
    >>> Position(2, 640).describe()
    {'epoch': 2, 'delivered': 640}
    """

    epoch: int
    cursor: Cursor

    def describe(self) -> dict[str, Any]:
        cursor = self.cursor
        return {"epoch": self.epoch, "delivered": list(cursor) if type(cursor) is tuple else cursor}


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """Steps from `first` on in batches of `size`, the first one at `position`.

    `left` batches finish the position's epoch, `per_epoch` make each later one (from the
    order's `zero` cursor); a segment whose batch size makes no batch at all (`per_epoch` 0)
    ends the plan at `first`.
    """

    first: int
    size: int
    position: Position
    left: int
    per_epoch: int
    zero: Cursor

    def locate(self, step: int) -> tuple[int, Cursor, int]:
        """The epoch of `step`, the cursor its part of the epoch starts at, and its place in
        that part."""
        offset = step - self.first
        if offset < self.left:
            return self.position.epoch, self.position.cursor, offset
        later, place = divmod(offset - self.left, self.per_epoch)
        return self.position.epoch + 1 + later, self.zero, place

    def epoch_start(self, epoch: int) -> int:
        """The first step of this segment, or after it, in `epoch` or a later one."""
        if epoch <= self.position.epoch or not self.per_epoch:
            return self.first
        return self.first + self.left + (epoch - self.position.epoch - 1) * self.per_epoch


def segments(
    order: EpochOrder[Any], first: int, position: Position, sizes: Sequence[tuple[int, int]]
) -> tuple[Segment, ...]:
    """The segments of a plan that starts at step `first` at `position`, with the batch size
    `sizes` gives from each of its steps on ((step, size) pairs, the first at `first`).

    A segment that can make no batch ends them: the plan ends at its first step.
    """
    result: list[Segment] = []
    for step, size in sizes:
        if result:
            previous = result[-1]
            epoch, cursor, place = previous.locate(step)
            position = Position(epoch, order.advance(epoch, cursor, previous.size, place))
        left = order.steps_left(position.cursor, size)
        per_epoch = order.steps_left(order.zero, size)
        if not left:
            position, left = Position(position.epoch + 1, order.zero), per_epoch
        result.append(Segment(step, size, position, left, per_epoch, order.zero))
        if not per_epoch:
            break
    return tuple(result)


def checked_changes(changes: Any, first_step: int) -> tuple[tuple[int, int], ...]:
    """Batch size changes as (step, size) int pairs at ascending steps after `first_step`,
    or a ValueError naming the first that is not."""
    checked: list[tuple[int, int]] = []
    previous = first_step
    for change in changes:
        if not isinstance(change, tuple | list) or len(change) != 2:
            raise ValueError(
                f"a batch size change must be a (step, batch_size) pair, got {change!r}"
            )
        step = require_int("a batch size change's step", change[0], minimum=previous + 1)
        size = require_int("a batch size change's batch_size", change[1], minimum=1)
        checked.append((step, size))
        previous = step
    return tuple(checked)
