"""The worker's memory budget: batch requests wait until the bytes they will take are free."""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable

from loadax.errors import WorkerError

log = logging.getLogger("loadax.server")

_MAX_ESTIMATES = 4096
"""Size estimates kept (least recently used go first): clients choose the kinds, so bound them."""


class MemoryBudget:
    """Bytes reserved by the batch requests being served, at most `limit`.

    Requests are admitted first come, first served: one that waits for room is not overtaken by
    smaller ones behind it, so no request starves. Waiters block on a condition.

    A request's size is that of the last of its kind (pipeline, rows); a kind never seen runs
    alone. One whose size, or the size its rows would take at the bytes per row seen of its
    pipeline (a line through the smallest and largest kinds seen, e.g. the worker's start-up
    probes), is over the limit is refused before anything is built.
    """

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self._wait_s = wait_s
        self._condition = threading.Condition()
        self._used = 0
        self._queue: deque[object] = deque()
        self._estimates: OrderedDict[tuple[str, int], int] = OrderedDict()
        # Per pipeline, (rows, bytes) of the smallest and of the largest kind seen.
        self._extremes: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}

    def reserve(self, kind: tuple[str, int], work: object) -> Callable[[], None]:
        """Wait for room for `work`, a request of `kind` (pipeline, rows); what frees the bytes
        reserved (only its first call does)."""
        with self._condition:
            self._refuse_if_too_large(kind)
            ticket = object()
            self._queue.append(ticket)

            def admissible() -> bool:
                # Sizes learnt while waiting count: requests queued behind the first of their
                # kind need not run alone too.
                if self._queue[0] is not ticket:
                    return False
                return self._too_large(kind) or self._used + self._need(kind) <= self.limit

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
                    )
                admitted = self._condition.wait_for(admissible, self._wait_s)
            finally:
                self._queue.remove(ticket)
                self._condition.notify_all()  # the next in line may fit now
            self._refuse_if_too_large(kind)
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
    def reserved(self) -> int:
        """The bytes reserved now by the requests being served."""
        with self._condition:
            return self._used

    def _need(self, kind: tuple[str, int]) -> int:
        """The bytes a request of `kind` reserves: a kind never seen runs alone."""
        estimate = self._estimates.get(kind)
        return self.limit if estimate is None else min(estimate, self.limit)

    def _too_large(self, kind: tuple[str, int]) -> bool:
        return self._estimate(kind) > self.limit

    def _estimate(self, kind: tuple[str, int]) -> int:
        """The bytes of a request of `kind`: as last seen, else from the bytes per row seen of
        its pipeline, else 0 (unknown)."""
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

    def _refuse_if_too_large(self, kind: tuple[str, int]) -> None:
        if kind in self._estimates:
            self._estimates.move_to_end(kind)
        if self._too_large(kind):
            pipeline, rows = kind
            raise WorkerError(
                "RESOURCE_EXHAUSTED",
                f"a batch of {rows} rows of pipeline {pipeline!r} encodes to about "
                f"{self._estimate(kind)} bytes, more than this worker's memory budget of "
                f"{self.limit} bytes; ask for fewer rows per request",
            )

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
