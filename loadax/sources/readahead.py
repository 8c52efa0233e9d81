"""Read-ahead for shards in a store: a shard read in order (a third request in a row starting
where the one before ended) has the bytes after it fetched in the background, as far ahead as
twice its request, doubling up to 16 MiB as the run goes on (an OS reads ahead of a file the
same way), in blocks of up to 4 MiB, and on into the next shard at its end, so that the next
batches' records are there when their reads ask. Random reads fetch nothing ahead (two
neighbours in a row by chance do not make a run). A block shuffle's windows are told ahead
(`ReadAhead.expect`): their bytes are fetched in the same large blocks and held while the
window is read, whatever the order of its reads."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from operator import attrgetter

NEAR = 64 << 10
"""A request starting at most this far after an earlier one's end reads on from it (the gap
is the headers of the members between two records)."""
_FURTHEST = 16 << 20  # the most read ahead of a run
_LARGEST_BLOCK = 4 << 20  # the longest request read ahead: several go at once, each soon there
_HELD = 32 << 20  # the most bytes read ahead (arrived or in flight) held at once, all runs
_RECENT = 4  # the ends of a shard's requests remembered: a few threads' chunks interleave
_SHARDS = 1024  # the shards whose requests are remembered, the most recently asked
_EXPECTED = 256 << 20  # the most bytes of expected windows held: the recent two or three

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    """Bytes `[start, end)` of a shard, fetched ahead (or on their way)."""

    shard: int
    start: int
    end: int
    data: Future[bytes]

    @property
    def failed(self) -> bool:
        """Whether fetching the block failed (or was cancelled)."""
        return self.data.done() and (self.data.cancelled() or self.data.exception() is not None)

    def part(self, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of the shard (within this block), once they have arrived."""
        return self.data.result()[start - self.start : end - self.start]


Fetch = Callable[[int, int, int], "Future[bytes]"]
"""`fetch(shard, offset, size)`: those bytes of the shard, on their way."""


class ReadAhead:
    """The blocks read ahead of a dataset's shards, of sizes `sizes`: at most 32 MiB of them,
    the oldest dropped first (a read that still waits on a dropped block gets its bytes all the
    same)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self._sizes = sizes
        self._lock = threading.Lock()
        self._blocks: deque[Block] = deque()  # oldest first
        self._held = 0
        # The ends of each shard's recent requests, and whether each continued an earlier one.
        self._ends: OrderedDict[int, deque[tuple[int, bool]]] = OrderedDict()
        self._windows: dict[int, int] = {}  # how far each shard read in order is read ahead
        # The blocks of each window expected (by its spans), the least recently expected first.
        self._expected: OrderedDict[tuple[tuple[int, int, int], ...], list[Block]] = OrderedDict()
        self._expected_held = 0
        self._warned = False  # of a window too large to hold

    def request(self, shard: int, offset: int, size: int, fetch: Fetch) -> list[Block] | None:
        """The blocks that hold the `size` bytes at `offset` of `shard`, or None when those
        bytes are not all read ahead; when the shard is read in order, fetches what follows."""
        end = offset + size
        with self._lock:
            self._drop_failed()
            expected = self._covering(self._expected_of(shard), offset, end) if size else None
            if expected is not None:  # a window's, read in any order: no run
                return expected
            ends = self._recent(shard)
            after = [run for previous, run in ends if 0 <= offset - previous <= NEAR]
            ends.append((end, bool(after)))
            blocks = self._covering(self._of(shard), offset, end) if size else None
            if any(after):  # the third request in a row: two could meet by chance
                self._drop_before(shard, offset)
                window = min(_FURTHEST, max(2 * size, 2 * self._windows.get(shard, 0)))
                self._windows[shard] = window
                self._ahead(shard, end, window, fetch)
            else:
                self._windows.pop(shard, None)
        return blocks

    def expect(self, spans: Sequence[tuple[int, int, int]], fetch: Fetch) -> None:
        """Have the byte `spans` (shard, start, end) of a window that reads will soon ask for,
        in any order, fetched in blocks of up to 4 MiB, unless they are already. The windows
        expected most recently are held, at most 256 MiB of them, the oldest dropped first; a
        window larger than that is not fetched (its reads ask for their own bytes)."""
        key, size = tuple(spans), sum(end - start for _, start, end in spans)
        with self._lock:
            if key in self._expected:
                self._expected.move_to_end(key)
                return
            if size > _EXPECTED:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "a shuffle window of %d MB is more than the %d MB read ahead: its "
                        "records are read one by one; choose a smaller block_size or window",
                        size >> 20,
                        _EXPECTED >> 20,
                    )
                return
            while self._expected and self._expected_held + size > _EXPECTED:
                _, dropped = self._expected.popitem(last=False)
                self._expected_held -= sum(block.end - block.start for block in dropped)
            self._expected[key] = [
                Block(shard, first, last, fetch(shard, first, last - first))
                for shard, start, end in spans
                for first, last in _pieces(start, end)
            ]
            self._expected_held += size

    def clear(self) -> None:
        """Forget every block and every shard's run."""
        with self._lock:
            self._blocks.clear()
            self._held = 0
            self._expected.clear()
            self._expected_held = 0
            self._ends.clear()
            self._windows.clear()

    def _ahead(self, shard: int, end: int, window: int, fetch: Fetch) -> None:
        """Have the `window` bytes after `end` of `shard` read ahead, fetching once half of them
        are not; past its end, the next shard's first ones."""
        start = max([end, *(block.end for block in self._of(shard))])
        if start >= end + window // 2:
            return
        stop = min(self._sizes[shard], end + window)
        if stop > start:
            self._add(shard, start, stop, fetch)
        after, rest = shard + 1, end + window - stop
        if (
            stop == self._sizes[shard]
            and rest > 0
            and after < len(self._sizes)
            and not self._of(after)  # not yet read ahead
        ):
            self._recent(after).append((0, True))
            self._add(after, 0, min(self._sizes[after], rest), fetch)

    def _recent(self, shard: int) -> deque[tuple[int, bool]]:
        """The ends of `shard`'s recent requests (forgetting the shard asked least recently)."""
        ends = self._ends.setdefault(shard, deque(maxlen=_RECENT))
        self._ends.move_to_end(shard)
        if len(self._ends) > _SHARDS:
            forgotten, _ = self._ends.popitem(last=False)
            self._windows.pop(forgotten, None)
        return ends

    def _add(self, shard: int, start: int, stop: int, fetch: Fetch) -> None:
        """Fetch bytes `[start, stop)` of `shard` in blocks of at most 4 MiB."""
        for first, last in _pieces(start, stop):
            while self._blocks and self._held + last - first > _HELD:
                dropped = self._blocks.popleft()
                self._held -= dropped.end - dropped.start
            self._blocks.append(Block(shard, first, last, fetch(shard, first, last - first)))
            self._held += last - first

    def _drop_failed(self) -> None:
        """Drop the blocks whose fetch failed: their reader raised the error; a later one
        reads for itself."""
        for block in [block for block in self._blocks if block.failed]:
            self._blocks.remove(block)
            self._held -= block.end - block.start
        for blocks in self._expected.values():
            for block in [block for block in blocks if block.failed]:
                blocks.remove(block)
                self._expected_held -= block.end - block.start

    @staticmethod
    def _covering(blocks: list[Block], start: int, end: int) -> list[Block] | None:
        """Consecutive ones of `blocks` that hold bytes `[start, end)`, or None."""
        chain: list[Block] = []
        for block in sorted(blocks, key=attrgetter("start")):
            if block.start <= start < block.end:
                chain.append(block)
                start = block.end
                if start >= end:
                    return chain
        return None

    def _of(self, shard: int) -> list[Block]:
        """The blocks of `shard`, read ahead of a run or of an expected window."""
        return [block for block in self._blocks if block.shard == shard] + self._expected_of(shard)

    def _expected_of(self, shard: int) -> list[Block]:
        windows = self._expected.values()
        return [block for window in windows for block in window if block.shard == shard]

    def _drop_before(self, shard: int, offset: int) -> None:
        """Drop the blocks of `shard` that end before `offset`: a run in order is past them."""
        kept = deque(b for b in self._blocks if b.shard != shard or b.end > offset)
        self._held = sum(block.end - block.start for block in kept)
        self._blocks = kept


def _pieces(start: int, stop: int) -> Iterator[tuple[int, int]]:
    """`[start, stop)` cut into blocks of at most 4 MiB."""
    for first in range(start, stop, _LARGEST_BLOCK):
        yield first, min(stop, first + _LARGEST_BLOCK)


def joined(blocks: Sequence[Block], offset: int, size: int) -> bytes:
    """The `size` bytes at `offset` that `blocks` (consecutive, covering them) hold."""
    end = offset + size
    parts = [block.part(max(offset, block.start), min(end, block.end)) for block in blocks]
    return parts[0] if len(parts) == 1 else b"".join(parts)
