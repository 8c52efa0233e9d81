"""Autotune: how many loading threads or processes, and how many batches ahead, chosen from what
a batch costs to load and how fast the training loop takes them, within a memory budget.

`decide` is the pure rule (numbers in, a `Tuning` out), so any executor that can be resized (a
local loader's threads or processes, or a fleet's local members) can reuse it; an `Autotuner`
measures a loader's iterators through `AutotunedExecutor` and applies the rule every `WINDOW`
batches, and stops adding workers once added ones did not speed loading up. Loading more or
fewer batches at once changes when a batch is made, never what it is.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Generic

from typing_extensions import TypeVar

from loadax.execution.executor import Executor, Pending
from loadax.iterators.stats import Tuning, array_bytes
from loadax.plan.planner import Plan
from loadax.plan.work import Work

log = logging.getLogger(__name__)

B = TypeVar("B", default=Any)

WINDOW = 8
"""Batches measured between two decisions."""
STARVED = 0.05
"""The share of its time the loop may wait in `next()` before loading counts as too slow."""
HEADROOM = 1.25
"""Workers beyond the measured need, for the jitter of record costs."""
DEFAULT_MEMORY_BUDGET_MB = 1024
"""The most bytes of batches autotune lets a loader hold, loading and ready, by default."""


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """What a window of `batches` batches showed: they came over `seconds`, the loop waiting for
    them `waited` of those, with `workers` loading and `prefetch` ahead; the largest was
    `batch_bytes`."""

    batches: int
    seconds: float
    waited: float
    workers: int
    prefetch: int
    batch_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """What autotune may choose: up to `max_workers`, holding at most `memory_bytes` of batches;
    `processes` (each loads whole batches and holds one in its shared memory) or threads (which
    split each batch); which of workers and prefetch it chooses (the others stay as they are)."""

    max_workers: int
    memory_bytes: int
    processes: bool
    workers: bool = True
    prefetch: bool = True


def decide(measured: Measured, limits: Limits) -> Tuning:
    """Workers and depth for the loop measured: while the loop starves, the workers that make a
    batch per loop step (each takes `workers` x the interval between batches to make one), and
    enough batches ahead to hide one batch's making behind the loop; within the memory budget.
    Workers never shrink (a pool that stops starving the loop keeps its size).

    >>> from loadax.execution.autotune import Limits, Measured, decide
    >>> starved = Measured(batches=8, seconds=0.8, waited=0.6, workers=1, prefetch=2,
    ...                    batch_bytes=1 << 20)
    >>> tuning = decide(starved, Limits(max_workers=16, memory_bytes=1 << 30, processes=True))
    >>> seconds = tuning.batch_seconds, tuning.loop_seconds
    >>> tuning.workers, tuning.prefetch, [round(value, 3) for value in seconds]
    (5, 5, [0.1, 0.025])
    >>> decide(starved, Limits(max_workers=3, memory_bytes=4 << 20, processes=True)).workers
    2
    """
    batches = max(measured.batches, 1)
    loop_s = max((measured.seconds - measured.waited) / batches, 1e-4)
    interval = measured.seconds / batches
    batch_s = measured.workers * interval  # one worker's seconds for a batch, while all are busy
    workers, prefetch = measured.workers, measured.prefetch
    if measured.seconds > 0 and measured.waited / measured.seconds > STARVED:
        if limits.workers:
            needed = _ceil(HEADROOM * batch_s / loop_s)
            workers = max(workers, min(limits.max_workers, needed))
        if limits.prefetch:
            latency = batch_s if limits.processes else batch_s / workers
            prefetch = max(prefetch, _ceil(latency / loop_s) + 1)
    size = max(measured.batch_bytes, 1)
    # A process holds a batch in its shared memory too; threads fill the batches in flight.
    held = max(1, limits.memory_bytes // size)
    if limits.processes and limits.workers:
        workers = max(1, min(workers, held // 2))
    if limits.prefetch:
        prefetch = max(1, min(prefetch, held - (workers if limits.processes else 0)))
    return Tuning(
        kind="processes" if limits.processes else "threads",
        workers=workers,
        prefetch=prefetch,
        batch_seconds=batch_s,
        loop_seconds=loop_s,
        batch_bytes=measured.batch_bytes,
    )


def _scaled(before: Measured, after: Measured) -> bool:
    """Whether the workers added since `before` sped loading up by half of what they could have,
    judged only while the loop still starved (else the loop set the pace)."""
    if after.workers <= before.workers or after.waited <= STARVED * after.seconds:
        return True
    gain = (before.seconds / before.batches) / (after.seconds / after.batches)
    return gain - 1 >= 0.5 * (after.workers / before.workers - 1)


def _ceil(ratio: float) -> int:
    """`ratio` rounded up, a ratio of measured seconds a hair above an integer not counted."""
    return math.ceil(ratio - 1e-9)


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Autotuner:
    """A loader's autotune: the workers and prefetch its iterators use now, and the window of
    measurements the next decision rests on. `report` hears each decision that changes them."""

    def __init__(
        self,
        limits: Limits,
        workers: int,
        prefetch: int,
        report: Callable[[Tuning], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits, self.workers, self.prefetch = limits, workers, prefetch
        self._report, self.clock = report, clock
        self._lock = threading.Lock()
        self._start: float | None = None  # the window's, after its first batch (start-up aside)
        self._settling = 0  # batches to pass over, loaded before the last change took effect
        self._previous: Measured | None = None  # the window before
        self._batches = 0
        self._waited = 0.0
        self._bytes = 0

    def took(self, asked: float, got: float, batch: Any) -> None:
        """The loop asked for a batch at `asked` and got `batch` at `got`."""
        with self._lock:
            if self._settling:
                self._settling -= 1
                return
            if self._start is None:
                self._start = got
                return
            self._batches += 1
            self._waited += got - asked
            self._bytes = max(self._bytes, array_bytes(batch))
            if self._batches < WINDOW:
                return
            measured = Measured(
                self._batches,
                got - self._start,
                self._waited,
                self.workers,
                self.prefetch,
                self._bytes,
            )
            self._start, self._batches, self._waited = got, 0, 0.0
            previous, self._previous = self._previous, measured
            if previous is not None and not _scaled(previous, measured):
                # Bound by something workers do not add (the GIL, the cores, the store).
                self.limits = dataclasses.replace(self.limits, max_workers=measured.workers)
            tuning = decide(measured, self.limits)
            if (tuning.workers, tuning.prefetch) == (self.workers, self.prefetch):
                return
            self.workers, self.prefetch = tuning.workers, tuning.prefetch
            self._start, self._settling = None, tuning.prefetch
        log.info(
            "autotune: %d loading %s, %d batches ahead (a batch takes one worker %.1f ms, the "
            "loop %.1f ms; batches of %d bytes)",
            tuning.workers,
            tuning.kind,
            tuning.prefetch,
            1e3 * tuning.batch_seconds,
            1e3 * tuning.loop_seconds,
            tuning.batch_bytes,
        )
        self._report(tuning)


class AutotunedExecutor(Executor[B]):
    """`executor`, as many workers (`resize`) and as far ahead as `tuner` says; it measures
    the batches the loop takes for it."""

    def __init__(
        self, executor: Executor[B], tuner: Autotuner, resize: Callable[[int], None]
    ) -> None:
        self._executor, self._tuner, self._resize = executor, tuner, resize
        self._workers = tuner.workers

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        if self._workers != self._tuner.workers:
            self._workers = self._tuner.workers
            self._resize(self._workers)
        return _Measured(self._executor.submit(plan, work), self._tuner)

    def lookahead(self, prefetch: int) -> int:
        del prefetch  # the tuner's, whatever the loader started with
        return self._tuner.prefetch

    def release(self, wait: bool) -> None:
        self._executor.release(wait)


class _Measured(Generic[B]):
    """A batch whose wait the tuner hears of."""

    def __init__(self, pending: Pending[B], tuner: Autotuner) -> None:
        self._pending, self._tuner = pending, tuner

    def result(self, timeout: float | None = None) -> B:
        asked = self._tuner.clock()
        batch = self._pending.result(timeout)
        self._tuner.took(asked, self._tuner.clock(), batch)
        return batch

    def cancel(self) -> None:
        self._pending.cancel()
