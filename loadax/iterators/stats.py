"""What a loader measures, local or remote: batches, bytes, the time the training loop waited for
data, and for a remote loader each worker's requests, failures, latency and quarantine, and the
targets it left out. `Loader.stats()` returns a snapshot.

The loop's numbers are counted where the loop meets the loader, in the iterators every loader
shares (`BatchIterator`, `StreamIterator`): they mean the same for every executor.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import jax
import numpy as np

LATENCY_WINDOW = 1024
"""Per worker, the latencies of this many most recent answers make its percentiles."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStats:
    """One worker's requests since the loader started using it (remote loaders only).

    `failures` counts the requests it failed or did not answer in time (each was sent to
    another worker); latencies (seconds, None before its first answer) are over its last
    `LATENCY_WINDOW` answers. `quarantined` is why the worker is quarantined (another pipeline
    identity, no such pipeline, a reply that failed its checks), None when it is not: it gets
    requests again only after a back-off, and leaves quarantine when it answers one.

    >>> from loadax.iterators.stats import StatsRecorder
    >>> recorder = StatsRecorder()
    >>> answered = recorder.track("worker-a", Future)
    >>> answered.set_result(b"")
    >>> recorder.failed("worker-a", "UNAVAILABLE: connection reset")
    >>> stats = recorder.snapshot(["worker-a"]).workers["worker-a"]
    >>> stats.requests, stats.failures, stats.last_error, stats.quarantined
    (1, 1, 'UNAVAILABLE: connection reset', None)
    """

    requests: int
    failures: int
    last_error: str | None
    latency_p50: float | None
    latency_p90: float | None
    latency_max: float | None
    quarantined: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class LoaderStats:
    """A loader's numbers since its first request, over all its iterators.

    `bytes` are those of the arrays of the batches delivered; `wait_fraction` is the share of
    the time since the first request that the training loop spent inside `next()` waiting for
    a batch (near 0: loading keeps up; near 1: the loop starves, add workers or prefetch).
    `workers` and `left_out` are a remote loader's (empty for a local one): each worker's
    requests, and the targets it does not use because of what they answered its handshake.

    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
    >>> batches = list(loader)
    >>> stats = loader.stats()
    >>> stats.batches, stats.bytes, 0 <= stats.wait_fraction <= 1, stats.workers
    (3, 48, True, {})
    """

    batches: int
    bytes: int
    seconds: float
    waited_seconds: float
    batches_per_second: float
    bytes_per_second: float
    wait_fraction: float
    workers: Mapping[str, WorkerStats]
    left_out: Mapping[str, str] = dataclasses.field(default_factory=dict)


class _WorkerRecord:
    def __init__(self) -> None:
        self.requests = self.failures = 0
        self.last_error: str | None = None
        self.quarantined: str | None = None
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)


class LoopCounts:
    """One iterator's share of a loader's numbers, counted without a lock by the thread that
    iterates it (a few hundred nanoseconds a batch).

    The iterator reads `clock()` when `next()` starts and calls `counted(started, batch)` when
    it ends (batch None when it yields none): the time in between is the loop waiting.
    """

    __slots__ = ("batches", "bytes", "clock", "first", "largest", "waited")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.first: float | None = None  # when its first next() began
        self.waited = 0.0
        self.batches = self.bytes = self.largest = 0

    def counted(self, started: float, batch: Any = None) -> None:
        """Count a `next()` that began at `started` and ends now, and the batch it yields."""
        now = self.clock()
        if self.first is None:
            self.first = started
        self.waited += now - started
        if batch is not None:
            size = batch.nbytes if type(batch) is np.ndarray else array_bytes(batch)
            self.batches += 1
            self.bytes += size
            if size > self.largest:
                self.largest = size

    def loaded(self, part: Any) -> None:
        """Note the size of a part an executor handed over that is not a batch (a stream's
        window): `largest` bounds how many a remote loader keeps in flight."""
        self.largest = max(self.largest, array_bytes(part))


class StatsRecorder:
    """The counters behind `LoaderStats`; `clock` gives seconds.

    Each iterator counts what its loop got and waited for in `counts(iterator)`, which the
    recorder adds up (and keeps once the iterator is gone). The fleet's side (`track`,
    `failed`, `quarantined`, `left_out`, `forget`) is a remote loader's, updated from any thread.

    >>> import numpy as np
    >>> from loadax.iterators.stats import StatsRecorder
    >>> now = [0.0]
    >>> recorder = StatsRecorder(clock=lambda: now[0])
    >>> class Iterator: ...
    >>> iterator = Iterator()
    >>> counts = recorder.counts(iterator)
    >>> started = counts.clock()  # next() starts at t = 0 and returns at t = 1
    >>> now[0] = 1.0
    >>> counts.counted(started, np.zeros(4, np.float32))
    >>> now[0] = 4.0  # the loop trains for 3 s
    >>> stats = recorder.snapshot([])
    >>> stats.batches, stats.bytes, stats.wait_fraction, stats.batches_per_second
    (1, 16, 0.25, 0.25)
    >>> del iterator  # its numbers stay
    >>> recorder.snapshot([]) == stats
    True
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._live: dict[int, LoopCounts] = {}  # the counts of iterators still alive
        self._done = LoopCounts(clock)  # the sum of those of iterators gone
        self._workers: dict[str, _WorkerRecord] = {}
        self._left_out: dict[str, str] = {}

    def counts(self, iterator: object) -> LoopCounts:
        """New counts for `iterator` to update, added up with the others until it is collected
        and kept after."""
        counts = LoopCounts(self.clock)
        with self._lock:
            self._live[id(counts)] = counts
        weakref.finalize(iterator, self._retire, counts)
        return counts

    @property
    def largest(self) -> int:
        """The bytes of the largest batch (or stream window) loaded so far; 0 before the first."""
        return self._total().largest

    def track(self, worker: str, send: Callable[[], Future[Any]]) -> Future[Any]:
        """`send()`, which sends a request to `worker`, counted; its latency once answered."""
        sent = self.clock()
        attempt = send()
        with self._lock:
            self._workers.setdefault(worker, _WorkerRecord()).requests += 1

        def answered(done: Future[Any]) -> None:
            if done.cancelled() or done.exception() is not None:
                return  # failures are counted by `failed`
            latency = self.clock() - sent
            with self._lock:
                record = self._workers.get(worker)
                if record is not None:
                    record.latencies.append(latency)

        attempt.add_done_callback(answered)
        return attempt

    def failed(self, worker: str, error: str) -> None:
        """Count a request that `worker` failed or did not answer in time."""
        with self._lock:
            record = self._workers.get(worker)
            if record is not None:
                record.failures += 1
                record.last_error = error

    def quarantined(self, worker: str, reason: str | None) -> None:
        """Note why `worker` is quarantined; None once it is not."""
        with self._lock:
            record = self._workers.get(worker)
            if record is not None:
                record.quarantined = reason

    def left_out(self, target: str, answer: str | None) -> None:
        """Note what `target` answered that left it out of the loader; None once it is used."""
        with self._lock:
            if answer is None:
                self._left_out.pop(target, None)
            else:
                self._left_out[target] = answer

    def forget(self, worker: str) -> None:
        """Drop the numbers of a worker no longer used (late answers from it are ignored)."""
        with self._lock:
            self._workers.pop(worker, None)

    def snapshot(self, workers: Sequence[str]) -> LoaderStats:
        """The numbers now; `workers` are the names of the workers in use (none for a local
        loader)."""
        now = self.clock()
        total = self._total()
        with self._lock:
            per_worker = {name: _worker_stats(self._workers.get(name)) for name in workers}
            left_out = dict(self._left_out)
        seconds = 0.0 if total.first is None else now - total.first
        batches, size, waited = total.batches, total.bytes, total.waited
        return LoaderStats(
            batches=batches,
            bytes=size,
            seconds=seconds,
            waited_seconds=waited,
            batches_per_second=batches / seconds if seconds > 0 else 0.0,
            bytes_per_second=size / seconds if seconds > 0 else 0.0,
            wait_fraction=min(waited / seconds, 1.0) if seconds > 0 else 0.0,
            workers=per_worker,
            left_out=left_out,
        )

    def _total(self) -> LoopCounts:
        """The counts of every iterator, alive or gone, added up."""
        total = LoopCounts(self.clock)
        with self._lock:
            for counts in (self._done, *self._live.values()):
                _add(total, counts)
        return total

    def _retire(self, counts: LoopCounts) -> None:
        with self._lock:
            del self._live[id(counts)]
            _add(self._done, counts)


def _add(total: LoopCounts, counts: LoopCounts) -> None:
    if counts.first is not None:
        total.first = counts.first if total.first is None else min(total.first, counts.first)
    total.waited += counts.waited
    total.batches += counts.batches
    total.bytes += counts.bytes
    total.largest = max(total.largest, counts.largest)


def array_bytes(batch: Any) -> int:
    """The bytes of the arrays of a batch (any pytree; leaves without `nbytes` count 0)."""
    if isinstance(batch, np.ndarray):  # the common case, without a walk of the tree
        return batch.nbytes
    return sum(int(getattr(leaf, "nbytes", 0)) for leaf in jax.tree_util.tree_leaves(batch))


def _worker_stats(record: _WorkerRecord | None) -> WorkerStats:
    if record is None:
        return WorkerStats(0, 0, None, None, None, None)
    ordered = sorted(record.latencies)
    return WorkerStats(
        requests=record.requests,
        failures=record.failures,
        last_error=record.last_error,
        latency_p50=_percentile(ordered, 0.5),
        latency_p90=_percentile(ordered, 0.9),
        latency_max=ordered[-1] if ordered else None,
        quarantined=record.quarantined,
    )


def _percentile(ordered: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of sorted values (None for none)."""
    if not ordered:
        return None
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]
