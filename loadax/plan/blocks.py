"""Block shuffles for data stored in shards: each epoch shuffles the order of blocks of
consecutive records, and the records within each window of consecutive blocks in that order.

An exact shuffle reads every record apart, one ranged request each. A block shuffle reads a
window's blocks and nothing else while that window is read, so a source in a store can fetch
each block in a few large requests (`loadax.dataset.records.will_read`), as webdataset streams
a shard; its quality is the class of webdataset's (shard order plus a shuffle buffer). Every
record still comes once per epoch, and the order is a pure function of (seed, epoch).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from loadax.plan.permutation import IndexArray, KeyPurpose, derive_key, permute
from loadax.validation import require_int


@dataclasses.dataclass(frozen=True, slots=True)
class BlockShuffle:
    """Records `[j * block_size, (j + 1) * block_size)` make block j; each epoch puts the
    blocks in a keyed random order and cuts it into windows of `window` blocks, whose records it
    shuffles together. The records after the last whole block (fewer than `block_size`) join
    one window, chosen anew each epoch.

    >>> from loadax.plan.blocks import BlockShuffle
    >>> import numpy as np
    >>> blocks = BlockShuffle(block_size=4, window=2)
    >>> order = blocks.records(np.arange(16), num_records=16, seed=0, epoch=0)
    >>> order.tolist()
    [11, 1, 8, 3, 2, 9, 0, 10, 7, 15, 12, 4, 13, 14, 6, 5]
    >>> [sorted(order[first : first + 8].tolist()) for first in (0, 8)]  # blocks 0, 2; 1, 3
    [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    """

    block_size: int
    window: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "block_size", require_int("block_size", self.block_size, minimum=1)
        )
        object.__setattr__(self, "window", require_int("window", self.window, minimum=1))

    def describe(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "window": self.window}

    def records(self, positions: IndexArray, num_records: int, seed: int, epoch: int) -> IndexArray:
        """The record at each of `positions` (all in [0, num_records)) of `epoch`'s order."""
        layout = _Layout(self, num_records, seed, epoch)
        windows = layout.window_at(positions)
        result = np.empty_like(positions)
        for window in np.unique(windows).tolist():
            chosen = windows == window
            result[chosen] = layout.records(window, positions[chosen] - layout.first(window))
        return result

    def windows(self, num_records: int, seed: int, epoch: int, positions: IndexArray) -> IndexArray:
        """The window each of `positions` of `epoch`'s order lies in."""
        return _Layout(self, num_records, seed, epoch).window_at(positions)

    def window_count(self, num_records: int) -> int:
        """How many windows an epoch of `num_records` records has."""
        return 0 if not num_records else max(1, -(-(num_records // self.block_size) // self.window))

    def window_ranges(
        self, num_records: int, seed: int, epoch: int, window: int
    ) -> tuple[IndexArray, IndexArray]:
        """The records of `window` of `epoch` as ranges `[starts[i], stops[i])`, ascending,
        neighbouring blocks joined.

        >>> from loadax.plan.blocks import BlockShuffle
        >>> starts, stops = BlockShuffle(4, 2).window_ranges(18, seed=0, epoch=0, window=0)
        >>> starts.tolist(), stops.tolist()  # blocks 0 and 2, and the last 2 records
        ([0, 8, 16], [4, 12, 18])
        """
        return _Layout(self, num_records, seed, epoch).ranges(window)


class _Layout:
    """The windows of one epoch: `whole` blocks of `block_size`, then a `tail` of fewer records
    that joins window `tail_window` (after its blocks)."""

    def __init__(self, blocks: BlockShuffle, num_records: int, seed: int, epoch: int) -> None:
        self.size, self.window = blocks.block_size, blocks.window
        self.num_records, self.seed, self.epoch = num_records, seed, epoch
        self.whole, self.tail = divmod(num_records, self.size)
        self.count = blocks.window_count(num_records)
        self.tail_window = self.count  # none
        if self.tail and self.count:
            choice = derive_key(KeyPurpose.BLOCK_TAIL, seed, epoch)[0] % np.uint64(self.count)
            self.tail_window = int(choice)
        self.order_key = derive_key(KeyPurpose.BLOCK_ORDER, seed, epoch)

    def blocks_in(self, window: int) -> int:
        return max(0, min(self.window, self.whole - window * self.window))

    def first(self, window: int) -> int:
        """The position of `window`'s first record in the epoch's order."""
        return window * self.window * self.size + (self.tail if window > self.tail_window else 0)

    def window_at(self, positions: IndexArray) -> IndexArray:
        span = self.window * self.size
        tail_start = self.first(self.tail_window)
        tail_end = tail_start + self.blocks_in(self.tail_window) * self.size + self.tail
        before, after = positions // span, (positions - self.tail) // span
        return np.where(
            positions < tail_start, before, np.where(positions < tail_end, self.tail_window, after)
        )

    def records(self, window: int, offsets: IndexArray) -> IndexArray:
        """The records at `offsets` within `window`."""
        in_blocks = self.blocks_in(window) * self.size
        length = in_blocks + (self.tail if window == self.tail_window else 0)
        key = derive_key(KeyPurpose.WINDOW_SHUFFLE, self.seed, self.epoch, window)
        shuffled = permute(offsets, length, key)
        in_tail = shuffled >= in_blocks
        slots, within = np.divmod(np.where(in_tail, 0, shuffled), self.size)
        blocks = permute(window * self.window + slots, self.whole, self.order_key)
        tail = self.whole * self.size + shuffled - in_blocks
        return np.where(in_tail, tail, blocks * self.size + within)

    def ranges(self, window: int) -> tuple[IndexArray, IndexArray]:
        first = window * self.window
        slots = np.arange(first, first + self.blocks_in(window), dtype=np.int64)
        starts = np.sort(permute(slots, self.whole, self.order_key)) * self.size
        stops = starts + self.size
        if window == self.tail_window:
            starts = np.append(starts, self.whole * self.size)
            stops = np.append(stops, self.num_records)
        joined = np.flatnonzero(starts[1:] != stops[:-1])  # the gaps between ranges
        return starts[np.r_[0, joined + 1]], stops[np.r_[joined, stops.size - 1]]
