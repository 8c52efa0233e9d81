"""The worker's memory budget: batch requests wait until the bytes they will take are free.

Every worker has one: by default a share of the machine's memory (or of its cgroup's limit, when
that is lower), so that no request rate makes it grow without bound.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from loadax.errors import WorkerError
from loadax.logfields import fields

log = logging.getLogger("loadax.server")

_MAX_ESTIMATES = 4096
"""Size estimates kept (least recently used go first): clients choose the kinds, so bound them."""
DEFAULT_SHARE = 4
"""A worker's default budget is 1/DEFAULT_SHARE of its memory: building a batch briefly takes
about three times its encoded size, and the pipeline's own data needs room too."""
CGROUP_LIMITS = ("memory.max", "memory/memory.limit_in_bytes")
"""The memory limit of the process's cgroup, v2 then v1, under the cgroup mount."""


def machine_memory(cgroups: Path = Path("/sys/fs/cgroup")) -> int:
    """The bytes of memory this process may use: the machine's, or its cgroup's limit (v2, or
    v1; under `cgroups`) when that is lower ("max", or v1's huge number, is no limit).

    >>> 0 < machine_memory() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    True
    """
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for name in CGROUP_LIMITS:
        try:
            text = (cgroups / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            memory = min(memory, int(text))
    return memory


def default_budget(cgroups: Path = Path("/sys/fs/cgroup")) -> int:
    """The memory budget of a worker that sets none: a share (1/DEFAULT_SHARE) of
    `machine_memory`."""
    return max(1, machine_memory(cgroups) // DEFAULT_SHARE)


def too_large(work: object, size: int, room: str) -> WorkerError:
    """The refusal of `work`, whose batch takes (or would take) `size` bytes, more than `room`:
    INVALID_ARGUMENT, as every worker would answer; never back-pressure.

    >>> print(too_large("the batch of step 3", 2000, "the 1000 a reply may hold").message)
    the batch of step 3 would be 2000 bytes, more than the 1000 a reply may hold; ask for fewer rows
    """
    return WorkerError(
        "INVALID_ARGUMENT", f"{work} would be {size} bytes, more than {room}; ask for fewer rows"
    )


class MemoryBudget:
    """Bytes reserved by the batch requests being served, at most `limit`.

    Requests are admitted first come, first served: one that waits for room is not overtaken by
    smaller ones behind it, so no request starves. Waiters block on a condition.

    A request's size is that of the last of its kind (pipeline, rows), else the size its rows
    would take at the bytes per row seen of its pipeline (`estimate`: a line through the
    smallest and largest kinds seen, e.g. the worker's start-up probes); a request that nothing
    tells of runs alone. One whose size is over the limit is refused (INVALID_ARGUMENT) before
    anything is built.

    A cache of built batches (`loadax.server.share_cache`) counts the bytes it alone holds as
    `cached`, in the limit too; a request that waits for room has it evict them first
    (`reclaim_with`).
    """

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self._wait_s = wait_s
        self.lock = threading.RLock()
        """The budget's lock, which a cache that counts its bytes here shares (it evicts under
        it)."""
        self._condition = threading.Condition(self.lock)
        self._used = 0
        self._cached = 0
        self._reclaim: Callable[[int], None] = lambda excess: None
        self._queue: deque[object] = deque()
        self._estimates: OrderedDict[tuple[str, int], int] = OrderedDict()
        # Per pipeline, (rows, bytes) of the smallest and of the largest kind seen.
        self._extremes: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}

    def reserve(self, kind: tuple[str, int], work: object) -> Callable[[], None]:
        """Wait for room for `work`, a request of `kind` (pipeline, rows); what frees the bytes
        reserved (only its first call does)."""
        with self._condition:
            self._refuse_if_too_large(kind, work)
            ticket = object()
            self._queue.append(ticket)

            def admissible() -> bool:
                # Sizes learnt while waiting count: requests queued behind the first of their
                # kind need not run alone too.
                if self._queue[0] is not ticket:
                    return False
                if self._too_large(kind):
                    return True
                if (excess := self._used + self._cached + self._need(kind) - self.limit) > 0:
                    self._reclaim(excess)
                return self._used + self._cached + self._need(kind) <= self.limit

            try:
                if not admissible():
                    log.debug(
                        "%s of pipeline %r waits for %d bytes of the memory budget "
                        "(%d of %d in use)",
                        work,
                        kind[0],
                        self._need(kind),
                        self._used,
                        self.limit,
                        extra=fields(event="memory_wait", pipeline=kind[0]),
                    )
                admitted = self._condition.wait_for(admissible, self._wait_s)
            finally:
                self._queue.remove(ticket)
                self._condition.notify_all()  # the next in line may fit now
            self._refuse_if_too_large(kind, work)
            need = self._need(kind)
            if not admitted:
                raise WorkerError(
                    "RESOURCE_EXHAUSTED",
                    f"{work} of pipeline {kind[0]!r} waited {self._wait_s:g} s for "
                    f"{need} bytes of this worker's memory budget of {self.limit} bytes "
                    f"({self._used} in use, {len(self._queue)} requests waiting); retry later "
                    "or on another worker",
                )
            self._used += need
            return at_most_once(functools.partial(self._release, need))

    @property
    def room(self) -> str:
        """What the budget holds, as a refusal names it."""
        return f"this worker's memory budget of {self.limit} bytes"

    @property
    def reserved(self) -> int:
        """The bytes reserved now by the requests being served."""
        with self._condition:
            return self._used

    @property
    def cached(self) -> int:
        """The bytes counted now for a cache of built batches (beyond `reserved`)."""
        with self._condition:
            return self._cached

    def count_cached(self, change: int) -> None:
        """A cache holds `change` bytes more (fewer, if negative) that nothing else counts."""
        with self._condition:
            self._cached += change
            if change < 0:
                self._condition.notify_all()

    def reclaim_with(self, evict: Callable[[int], None]) -> None:
        """`evict(excess)` is called, under `lock`, when a request waits for `excess` bytes more
        than the limit leaves: the cache gives up what it can."""
        self._reclaim = evict

    def _need(self, kind: tuple[str, int]) -> int:
        """The bytes a request of `kind` reserves: its estimate; one that nothing tells (no
        batch of its pipeline seen yet) runs alone."""
        estimate = self._estimate(kind)
        return self.limit if estimate == 0 else min(estimate, self.limit)

    def _too_large(self, kind: tuple[str, int]) -> bool:
        return self._estimate(kind) > self.limit

    def estimate(self, kind: tuple[str, int]) -> int:
        """The bytes of a request of `kind` (pipeline, rows): as last seen, else from the bytes
        per row seen of its pipeline, else 0 (unknown)."""
        with self._condition:
            return self._estimate(kind)

    def _estimate(self, kind: tuple[str, int]) -> int:
        known = self._estimates.get(kind)
        if known is not None:
            return known
        pipeline, rows = kind
        extremes = self._extremes.get(pipeline)
        if extremes is None:
            return 0
        (few, few_bytes), (many, many_bytes) = extremes
        if many == few:
            return many_bytes * rows // max(many, 1)
        per_row = max(many_bytes - few_bytes, 0) / (many - few)
        return int(few_bytes + per_row * (rows - few))

    def _refuse_if_too_large(self, kind: tuple[str, int], work: object) -> None:
        if kind in self._estimates:
            self._estimates.move_to_end(kind)
        if self._too_large(kind):
            raise too_large(work, self._estimate(kind), self.room)

    def learn(self, kind: tuple[str, int], size: int) -> None:
        """Note that a request of `kind` encoded to `size` bytes."""
        with self._condition:
            self._estimates[kind] = size
            self._estimates.move_to_end(kind)
            while len(self._estimates) > _MAX_ESTIMATES:
                self._estimates.popitem(last=False)
            pipeline, rows = kind
            seen = (rows, size)
            few, many = self._extremes.get(pipeline, (seen, seen))
            self._extremes[pipeline] = (min(few, seen), max(many, seen))

    def _release(self, reserved: int) -> None:
        with self._condition:
            self._used -= reserved
            self._condition.notify_all()


def at_most_once(release: Callable[[], None]) -> Callable[[], None]:
    """`release`, run by the first call only: a transport may end a reservation on more than
    one path (its reply sent, or dropped)."""
    pending = [release]
    lock = threading.Lock()

    def once() -> None:
        with lock:
            todo = pending.pop() if pending else None
        if todo is not None:
            todo()

    return once
