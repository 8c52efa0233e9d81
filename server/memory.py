"""The worker's memory budget: batch requests wait until the bytes they will take are free."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque

from loadax.errors import WorkerError

log = logging.getLogger("loadax.server")

_MAX_ESTIMATES = 4096
"""Size estimates kept (least recently used go first): clients choose the kinds, so bound them."""


class MemoryBudget:
    """Bytes reserved by the batch requests being served, at most `limit`.

    Requests are admitted first come, first served: one that waits for room is not overtaken by
    smaller ones behind it, so no request starves. Waiters block on a condition.
    """

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self._wait_s = wait_s
        self._condition = threading.Condition()
        self._used = 0
        self._queue: deque[object] = deque()
        self._estimates: OrderedDict[tuple[str, int], int] = OrderedDict()

    def reserve(self, kind: tuple[str, int], work: object) -> int:
        """Wait for room for `work`, a request of `kind` (pipeline, rows); the bytes reserved."""
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
            return need

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
        return self._estimates.get(kind, 0) > self.limit

    def _refuse_if_too_large(self, kind: tuple[str, int]) -> None:
        if kind in self._estimates:
            self._estimates.move_to_end(kind)
        if self._too_large(kind):
            pipeline, rows = kind
            raise WorkerError(
                "RESOURCE_EXHAUSTED",
                f"a batch of {rows} rows of pipeline {pipeline!r} encodes to about "
                f"{self._estimates[kind]} bytes, more than this worker's memory budget of "
                f"{self.limit} bytes; ask for fewer rows per request",
            )

    def learn(self, kind: tuple[str, int], size: int) -> None:
        with self._condition:
            self._estimates[kind] = size
            self._estimates.move_to_end(kind)
            while len(self._estimates) > _MAX_ESTIMATES:
                self._estimates.popitem(last=False)

    def release(self, reserved: int) -> None:
        with self._condition:
            self._used -= reserved
            self._condition.notify_all()
