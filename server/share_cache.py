"""Each batch computed once: a worker's requests with one digest share one computation, and a
bounded cache of the replies it built recently serves those that come a little later.

A batch is a pure function of what its request names (`loadax.wire.plans.request_digest`:
pipeline identity, plan, step, rows), so requests with one digest, of any clients (a sweep's jobs,
a job's processes that own the same rows), are answered by the same bytes. The first builds the
batch; those that come while it is built wait for it (coalesced), those that come later while it
is cached get it at once (hits). The cache's bytes count in the worker's memory budget and are
given back to a request that waits for room in it: an eviction costs a computation, never a wrong
answer. A computation that fails is not shared, except a failure of the work itself (its pipeline
raised, a record failed, it poisoned its loader), which every worker would answer alike. A batch
stacked in its client's memory file (`EncodedBatch.borrowed`) is shared and cached as a copy,
made only when a request waits for it or the cache keeps it: that client reuses its file.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable

from loadax.errors import WorkerError
from loadax.reuse import ReuseCounts, ReuseStats
from loadax.server.memory import MemoryBudget, at_most_once
from loadax.wire.failures import PipelineFailed, PoisonFailed, RecordFailed
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import request_digest
from loadax.wire.v1 import worker_pb2 as wire

DEFAULT_SHARE = 4
"""A worker's cache of built replies holds at most 1/DEFAULT_SHARE of its memory budget unless
`[server] share_cache_mb` says otherwise."""
_Key = bytes  # a request digest: one batch's bytes, whoever asks and with whichever checksum


@dataclasses.dataclass(eq=False, slots=True)
class _Built:
    """A batch built for one key. Its bytes count in the budget while a reply of it is not yet
    sent (`reservation`, the builder's, until its replies are all sent) or it is cached (then as
    the budget's `cached` bytes, once the reservation is gone)."""

    batch: EncodedBatch
    reservation: Callable[[], None] | None
    replies: int = 0
    cached: bool = False
    counted: bool = False  # in the budget's cached bytes

    @property
    def size(self) -> int:
        return self.batch.size


@dataclasses.dataclass(eq=False, slots=True)
class _Building:
    """A computation under way: `done` once it has `built` a batch, or failed (`error`, when its
    failure is the answer to every request of its key; else None, and a waiter asks again)."""

    done: bool = False
    built: _Built | None = None
    error: WorkerError | None = None
    waiting: int = 0  # the requests waiting for it


class ShareCache:
    """Shares the batches built for requests of one digest, and caches up to `capacity` bytes of
    them (0: coalesces only), counted in `budget` (whose lock it shares: it evicts when a request
    waits for room)."""

    def __init__(self, budget: MemoryBudget, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"a share cache's capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self._budget = budget
        self._lock = budget.lock
        self._changed = threading.Condition(self._lock)
        self._building: dict[_Key, _Building] = {}
        self._cache: OrderedDict[_Key, _Built] = OrderedDict()
        self._size = 0
        self._counts = ReuseCounts()
        budget.reclaim_with(self._evict)

    def serve(
        self,
        request: wire.BatchRequest,
        build: Callable[[], EncodedBatch],
        wanted: Callable[[], bool] | None = None,
    ) -> EncodedBatch:
        """The reply to `request`: a cached one, the one a computation under way for its digest
        makes, else `build()`'s; its checksum is of the kind the request that built it asked for
        (`EncodedBatch.checksummed_for` answers each with its own). Its `release` must be
        called once it is sent. A wait for
        another's computation ends CANCELLED once `wanted()` is false (asked again at `wake`)."""
        key = request_digest(request)
        while True:
            with self._lock:
                built = self._cache.get(key)
                if built is not None:
                    self._cache.move_to_end(key)
                    self._counts.hit(built.size)
                    return self._reply(built, wire.REUSE_CACHED)
                building = self._building.get(key)
                if building is None:
                    building = self._building[key] = _Building()
                    break  # this request builds it
                building.waiting += 1
                self._changed.wait_for(functools.partial(_over, building, wanted))
                building.waiting -= 1
                if not building.done:
                    raise WorkerError(
                        "CANCELLED", f"step {request.step} was cancelled by the client"
                    )
                if building.error is not None:
                    raise building.error
                if building.built is not None:
                    self._counts.hit(building.built.size, coalesced=True)
                    return self._reply(building.built, wire.REUSE_COALESCED)
                # Its computation failed, or its batch is its request's alone: ask again.
        try:
            batch = build()
        except BaseException as error:
            with self._lock:
                del self._building[key]
                building.done = True
                if isinstance(error, PipelineFailed | RecordFailed | PoisonFailed):
                    building.error = error
                self._changed.notify_all()
            raise
        shared: EncodedBatch | None = batch
        if batch.borrowed:  # a request that comes after this decision builds its own
            with self._lock:
                copied = building.waiting > 0 or self.capacity >= batch.size
            shared = batch.owned() if copied else None
        with self._lock:
            self._counts.miss()
            built = _Built(batch if shared is None else shared, batch.release)
            building.built = None if shared is None else built
            del self._building[key]
            building.done = True
            self._changed.notify_all()
            if shared is not None and self.capacity >= built.size:
                self._cache[key] = built
                built.cached = True
                self._size += built.size
                while self._size > self.capacity:
                    self._drop_oldest()
            return self._reply(built, wire.REUSE_COMPUTED, batch)

    def wake(self) -> None:
        """Requests waiting for another's computation ask their `wanted()` again."""
        with self._lock:
            self._changed.notify_all()

    def stats(self) -> ReuseStats:
        """Hits, misses (computed), coalesced requests, bytes saved and the bytes cached."""
        with self._lock:
            return self._counts.snapshot(self._size)

    def _reply(
        self, built: _Built, reuse: wire.Reuse, batch: EncodedBatch | None = None
    ) -> EncodedBatch:
        """A reply of `built` (as `batch`, its builder's, if given) that says how it came
        (`reuse`), held until its `release`."""
        built.replies += 1
        release = at_most_once(functools.partial(self._sent, built))
        reply = built.batch if batch is None else batch
        return dataclasses.replace(reply, reuse=reuse, release=release)

    def _sent(self, built: _Built) -> None:
        with self._lock:
            built.replies -= 1
            self._settle(built)

    def _settle(self, built: _Built) -> None:
        """Count `built`'s bytes where they belong now (under the lock)."""
        if built.replies:
            return
        if built.reservation is not None:
            reservation, built.reservation = built.reservation, None
            if built.cached:  # the cache alone holds it from now on
                built.counted = True
                self._budget.count_cached(built.size)
            reservation()
        elif built.counted and not built.cached:
            built.counted = False
            self._budget.count_cached(-built.size)

    def _drop_oldest(self) -> None:
        _, built = self._cache.popitem(last=False)
        built.cached = False
        self._size -= built.size
        self._settle(built)

    def _evict(self, excess: int) -> None:
        """Give `excess` bytes back to the budget, the least recently used first, if the cache
        holds them (called by the budget, under the lock)."""
        target = self._budget.cached - excess
        while self._cache and self._budget.cached > target:
            self._drop_oldest()


def _over(building: _Building, wanted: Callable[[], bool] | None) -> bool:
    """Whether a wait for `building` is over: it is done, or its requester no longer waits."""
    return building.done or (wanted is not None and not wanted())
