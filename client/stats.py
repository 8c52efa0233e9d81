"""What a `RemoteLoader` measures: batches, bytes, the time the training loop waited for data,
each worker's requests, failures, latency and quarantine, and the targets it left out.
`RemoteLoader.stats()` returns a snapshot.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import jax

from loadax.execution.executor import FuturePending

LATENCY_WINDOW = 1024
"""Per worker, the latencies of this many most recent answers make its percentiles."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStats:
    """One worker's requests since the loader started using it.

    `failures` counts the requests it failed or did not answer in time (each was sent to
    another worker); latencies (seconds, None before its first answer) are over its last
    `LATENCY_WINDOW` answers. `quarantined` is why the worker is quarantined (another pipeline
    identity, no such pipeline, a reply that failed its checks), None when it is not: it gets
    requests again only after a back-off, and leaves quarantine when it answers one.

    >>> from loadax import Batcher, Pipeline, RangeDataset
    >>> from loadax.client import RemoteDataLoader
    >>> from loadax.server.worker import Worker
    >>> worker = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> with RemoteDataLoader([worker], pipeline="numbers").batch_size(2).build() as loader:
    ...     batches = list(loader)
    ...     stats = loader.stats().workers["in-process Worker"]
    >>> stats.requests, stats.failures, stats.last_error, stats.latency_max is not None
    (3, 0, None, True)
    >>> stats.quarantined is None
    True
    >>> worker.close()

    A worker that no longer serves the loader's pipeline is quarantined; the others serve:

    >>> good = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> other = Worker({"letters": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> class Restarted:  # handshakes as `good` did, then answers as `other` does
    ...     def handshake(self, request):
    ...         return good.handshake(request)
    ...     def load_batch(self, request):
    ...         return other.load_batch(request)
    >>> with RemoteDataLoader([good, Restarted()], "numbers").batch_size(2).build() as loader:
    ...     batches = [batch.tolist() for batch in loader]
    ...     stats = loader.stats().workers["in-process Restarted"]
    >>> batches
    [[0, 1], [2, 3], [4, 5]]
    >>> print(stats.quarantined)
    NOT_FOUND: unknown pipeline 'numbers': this worker serves ['letters']
    >>> good.close(), other.close()
    (None, None)
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
    the time since the first request that the training loop spent blocked in `next()`
    waiting for a batch (near 0: the workers keep up; near 1: the loop starves). `left_out`
    names the targets the loader does not use because of what they answered its handshake
    (another pipeline identity, no such pipeline, an incompatible loadax version), each with
    that answer.

    >>> from loadax import Batcher, Pipeline, RangeDataset
    >>> from loadax.client import RemoteDataLoader
    >>> from loadax.server.worker import Worker
    >>> worker = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> with RemoteDataLoader([worker], pipeline="numbers").batch_size(2).build() as loader:
    ...     batches = list(loader)
    ...     stats = loader.stats()
    >>> stats.batches, stats.bytes, list(stats.workers), 0 <= stats.wait_fraction <= 1
    (3, 48, ['in-process Worker'], True)
    >>> stats.left_out
    {}
    >>> worker.close()
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


class StatsRecorder:
    """The counters behind `LoaderStats`, updated from any thread; `clock` gives seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._started: float | None = None
        self._batches = self._bytes = self._largest = 0
        self._waited = 0.0
        self._workers: dict[str, _WorkerRecord] = {}
        self._left_out: dict[str, str] = {}

    def timed(self, batch: Future[Any], *, window: bool = False) -> TimedPending:
        """The pending batch a loader's iterator waits on, its wait and size counted; a
        stream's `window` counts as bytes and wait, not as a batch."""
        with self._lock:
            if self._started is None:
                self._started = self.clock()
        return TimedPending(batch, self, window)

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

    def waited(self, seconds: float) -> None:
        """Count time the training loop spent waiting for a batch."""
        with self._lock:
            self._waited += seconds

    def delivered(self, size: int, *, window: bool = False) -> None:
        """Count a batch (or a stream's window) of `size` bytes that the training loop got."""
        with self._lock:
            if not window:
                self._batches += 1
            self._bytes += size
            self._largest = max(self._largest, size)

    @property
    def largest(self) -> int:
        """The bytes of the largest batch (or window) delivered so far; 0 before the first."""
        with self._lock:
            return self._largest

    def snapshot(self, workers: Sequence[str]) -> LoaderStats:
        """The numbers now; `workers` are the names of the workers in use."""
        now = self.clock()
        with self._lock:
            seconds = 0.0 if self._started is None else now - self._started
            per_worker = {name: _worker_stats(self._workers.get(name)) for name in workers}
            batches, size, waited = self._batches, self._bytes, self._waited
            left_out = dict(self._left_out)
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


class TimedPending(FuturePending[Any]):
    """A batch being loaded; the time `result()` blocks is the time the loop waits. Its size is
    counted when it arrives, on the thread that receives it."""

    def __init__(self, batch: Future[Any], stats: StatsRecorder, window: bool) -> None:
        super().__init__(batch)
        self._stats, self._window = stats, window
        # Not a bound method: a cycle through the future would keep the batch until a gc run.
        self._size = _Size()
        batch.add_done_callback(self._size.measure)

    def result(self, timeout: float | None = None) -> Any:
        started = self._stats.clock()
        try:
            batch = super().result(timeout)
        finally:
            self._stats.waited(self._stats.clock() - started)
        self._stats.delivered(self._size.bytes, window=self._window)
        return batch


class _Size:
    """The bytes of a batch's arrays, measured once it arrives."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0

    def measure(self, batch: Future[Any]) -> None:
        if not batch.cancelled() and batch.exception() is None:
            self.bytes = _array_bytes(batch.result())


def _array_bytes(batch: Any) -> int:
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
