"""What reuse saved: the numbers of a worker's shared replies and of a `cache()` op, in one shape
for `stats()` and Prometheus on client and worker."""

from __future__ import annotations

import dataclasses
import threading

from loadax.wire.v1 import worker_pb2 as wire


@dataclasses.dataclass(frozen=True, slots=True)
class ReuseStats:
    """Counts since start: `hits` served from a cache, `misses` computed, `coalesced` answered by
    a computation another request started (a worker's requests with one digest), `bytes_saved`
    the bytes of hits and coalesced answers, `size_bytes` what the cache holds now.

    >>> ReuseStats(hits=2, misses=1, bytes_saved=200) + ReuseStats(hits=1, size_bytes=50)
    ReuseStats(hits=3, misses=1, coalesced=0, bytes_saved=200, size_bytes=50)
    """

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    bytes_saved: int = 0
    size_bytes: int = 0

    def __add__(self, other: ReuseStats) -> ReuseStats:
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)
        return ReuseStats(*(mine + theirs for mine, theirs in pairs))


class ReuseCounts:
    """Counters behind a `ReuseStats`, safe to count from any thread; the size is the owner's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits = self._misses = self._coalesced = self._saved = 0

    def hit(self, size: int, *, coalesced: bool = False) -> None:
        """A request answered without computing, `size` bytes."""
        with self._lock:
            if coalesced:
                self._coalesced += 1
            else:
                self._hits += 1
            self._saved += size

    def miss(self) -> None:
        with self._lock:
            self._misses += 1

    def replied(self, header: wire.BatchResponse) -> None:
        """A worker's reply, counted by how the worker came by its batch (`header.reuse`)."""
        if header.reuse == wire.REUSE_COMPUTED:
            self.miss()
        else:
            self.hit(header.payload_size, coalesced=header.reuse == wire.REUSE_COALESCED)

    def snapshot(self, size_bytes: int) -> ReuseStats:
        with self._lock:
            return ReuseStats(self._hits, self._misses, self._coalesced, self._saved, size_bytes)
