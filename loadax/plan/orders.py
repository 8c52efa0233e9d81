"""How an epoch's records are cut into batches, from a cursor that says what of it is delivered.

A plan walks its epochs through an `EpochOrder`: the plain order (every record in one keyed
sequence, the cursor a count of records) or a length-bucketed one (`loadax.plan.buckets`, a
cursor per bucket). Each answers for a part of an epoch: the batches of one size that start at a
cursor, so that a new batch size continues the epoch from the first record not yet delivered.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Generic, TypeVar

from loadax.plan.blocks import BlockShuffle
from loadax.plan.permutation import IndexArray, KeyPurpose, derive_key, permute

Cursor = int | tuple[int, ...]
"""What of an epoch is delivered: a count of records (per bucket for a bucketed order)."""

C = TypeVar("C", int, tuple[int, ...])


class EpochOrder(abc.ABC, Generic[C]):
    """The records of each epoch in order, cut into batches of `size` from a `cursor`.

    A part is the batches of one size from a cursor to the end of the epoch; its step `t`
    is its t-th batch.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def zero(self) -> C:
        """The cursor of an epoch of which nothing is delivered."""

    @abc.abstractmethod
    def steps_left(self, cursor: C, size: int) -> int:
        """How many batches of `size` finish the epoch from `cursor` (a short last one counts
        unless remainders are dropped)."""

    @abc.abstractmethod
    def batch_length(self, epoch: int, cursor: C, size: int, step: int) -> int:
        """Records in batch `step` of the part."""

    @abc.abstractmethod
    def records(
        self, epoch: int, cursor: C, size: int, step: int, positions: IndexArray
    ) -> IndexArray:
        """The record indices at `positions` of batch `step` of the part."""

    @abc.abstractmethod
    def advance(self, epoch: int, cursor: C, size: int, steps: int) -> C:
        """The cursor once the first `steps` batches of the part are delivered."""

    @abc.abstractmethod
    def lengths(self, cursor: C, size: int) -> set[int]:
        """Every length a batch of the part has."""

    @abc.abstractmethod
    def check_cursor(self, cursor: Any) -> C:
        """`cursor` as this order's, or a ValueError naming what is wrong with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class PlainOrder(EpochOrder[int]):
    """Every record once per epoch, in index order or (`shuffle`) a keyed permutation of it
    (with `blocks`, a block shuffle's).

    >>> from loadax.plan.orders import PlainOrder
    >>> import numpy as np
    >>> order = PlainOrder(num_records=10, seed=0, shuffle=False, drop_remainder=False)
    >>> order.steps_left(4, 4), order.records(0, 4, 4, 1, np.arange(2)).tolist()
    (2, [8, 9])
    """

    num_records: int
    seed: int
    shuffle: bool
    drop_remainder: bool
    blocks: BlockShuffle | None = None

    @property
    def zero(self) -> int:
        return 0

    def steps_left(self, cursor: int, size: int) -> int:
        left = self.num_records - cursor
        return left // size if self.drop_remainder else -(-left // size)

    def batch_length(self, epoch: int, cursor: int, size: int, step: int) -> int:
        return min(size, self.num_records - cursor - step * size)

    def records(
        self, epoch: int, cursor: int, size: int, step: int, positions: IndexArray
    ) -> IndexArray:
        return self.shuffled(positions + (cursor + step * size), epoch)

    def shuffled(self, positions: IndexArray, epoch: int) -> IndexArray:
        """The records at `positions` of `epoch`'s order."""
        if not self.shuffle:
            return positions
        if self.blocks is not None:
            return self.blocks.records(positions, self.num_records, self.seed, epoch)
        key = derive_key(KeyPurpose.PLAN_SHUFFLE, self.seed, epoch)
        return permute(positions, self.num_records, key)

    def advance(self, epoch: int, cursor: int, size: int, steps: int) -> int:
        return min(self.num_records, cursor + steps * size)

    def lengths(self, cursor: int, size: int) -> set[int]:
        full, short = divmod(self.num_records - cursor, size)
        return ({size} if full else set()) | (
            {short} if short and not self.drop_remainder else set()
        )

    def check_cursor(self, cursor: Any) -> int:
        if type(cursor) is not int or not 0 <= cursor <= self.num_records:
            raise ValueError(
                f"the records delivered of the epoch must be an int in [0, {self.num_records}], "
                f"got {cursor!r}"
            )
        return cursor
