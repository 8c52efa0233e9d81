"""What a loader measures: the batches and bytes the training loop got and the time it waited for
them. `Loader.stats()` returns a snapshot.

The loop's numbers are counted where the loop meets the loader, in the iterators every loader
shares (`BatchIterator`, `StreamIterator`, or with device prefetch the `DeviceIterator` over
them, which takes batches ahead of the loop): they mean the same for every executor. A remote
loader adds what its fleet counts (per worker, and the targets left out) to the snapshot.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from loadax.reuse import ReuseStats


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStats:
    """One worker's requests since a remote loader started using it (counted by the client).

    `failures` counts the requests it failed or did not answer in time (each was sent to
    another worker); latencies (seconds, None before its first answer) are over its most recent
    answers. `quarantined` is why the worker is quarantined (another pipeline identity, no such
    pipeline, a reply that failed its checks), None when it is not: it gets requests again only
    after a back-off, and leaves quarantine when it answers one.

    >>> from loadax.iterators.stats import StatsRecorder
    >>> fleet = {"worker-a": WorkerStats(1, 1, "UNAVAILABLE: reset", 0.1, 0.1, 0.1)}
    >>> StatsRecorder().snapshot(fleet).workers["worker-a"].failures
    1
    """

    requests: int
    failures: int
    last_error: str | None
    latency_p50: float | None
    latency_p90: float | None
    latency_max: float | None
    quarantined: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that failed to load, which a bad-record policy (`on_record_error`) skipped or
    replaced: its `index` and `epoch`, the `step` and `row` of the batch it was to be in, what it
    raised (`cause`: "TypeName: message") and what became of its row (`action`: "skipped" or
    "replaced by record N")."""

    index: int
    epoch: int
    step: int
    row: int
    cause: str
    action: str


@dataclasses.dataclass(frozen=True, slots=True)
class Tuning:
    """What autotune (`workers("auto")`, `prefetch("auto")`) chose last, and from what: `workers`
    threads or processes (`kind`) and `prefetch` batches ahead, for batches that take one worker
    `batch_seconds` to load (measured while the training loop waited) and a loop that spends
    `loop_seconds` on each outside `next()`; batches of `batch_bytes` (the largest seen)."""

    kind: str
    workers: int
    prefetch: int
    batch_seconds: float
    loop_seconds: float
    batch_bytes: int


MAX_BAD_RECORDS = 100
"""The most recent bad records a loader's stats list (`bad_record_count` counts them all)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LoaderStats:
    """A loader's numbers since its first request, over all its iterators.

    `bytes` are those of the arrays of the batches delivered; `wait_fraction` is the share of
    the time since the first request that the training loop spent inside `next()` waiting for
    a batch (near 0: loading keeps up; near 1: the loop starves, add workers or prefetch).
    `workers` and `left_out` are a remote loader's (empty for a local one): each worker's
    requests, and the targets it does not use because of what they answered its handshake.
    `bad_records` are the most recent records a bad-record policy skipped or replaced (at most
    `MAX_BAD_RECORDS`), `bad_record_count` all of them. `tuning` is autotune's last choice (None
    before its first, or without autotune). `reuse` is what reuse saved: a local loader's
    `cache()` ops in this process, or the replies a remote loader's workers built for other
    requests with the same digest (`hits` from their caches, `coalesced`).

    A remote loader also measures its recent past (`RemoteDataLoader.sizing`):
    `input_stall_fraction` is the share of it the loop waited, and `workers_wanted` the remote
    workers that would keep that under the target with one to spare (None for a local loader,
    or before the loop and a remote worker have been measured).

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
    bad_records: tuple[BadRecord, ...] = ()
    bad_record_count: int = 0
    tuning: Tuning | None = None
    reuse: ReuseStats = dataclasses.field(default_factory=ReuseStats)
    input_stall_fraction: float | None = None
    workers_wanted: int | None = None


class LoopCounts:
    """One iterator's share of a loader's numbers, counted without a lock by the thread that
    iterates it (a few hundred nanoseconds a batch).

    The iterator reads `clock()` when `next()` starts and calls `counted(started, batch)` when
    it ends (batch None when it yields none): the time in between is the loop waiting. The
    counts of an iterator whose batches the loop does not take directly (`loop` False: a host
    iterator under device prefetch, which counts them itself) note only the batches' sizes.
    """

    __slots__ = ("batches", "bytes", "clock", "first", "largest", "loop", "waited")

    def __init__(self, clock: Callable[[], float], loop: bool = True) -> None:
        self.clock, self.loop = clock, loop
        self.first: float | None = None  # when its first next() began
        self.waited = 0.0
        self.batches = self.bytes = self.largest = 0

    def counted(self, started: float, batch: Any = None) -> None:
        """Count a `next()` that began at `started` and ends now, and the batch it yields."""
        if batch is None:
            self.took(started, None)
        else:
            self.took(started, batch.nbytes if type(batch) is np.ndarray else array_bytes(batch))

    def took(self, started: float, size: int | None) -> None:
        """Count a `next()` that began at `started` and ends now, yielding a batch of `size`
        bytes (None: no batch)."""
        if not self.loop:
            self.largest = max(self.largest, size or 0)
            return
        now = self.clock()
        if self.first is None:
            self.first = started
        self.waited += now - started
        if size is not None:
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
    recorder adds up (and keeps once the iterator is gone).

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
    >>> stats = recorder.snapshot()
    >>> stats.batches, stats.bytes, stats.wait_fraction, stats.batches_per_second
    (1, 16, 0.25, 0.25)
    >>> del iterator  # its numbers stay
    >>> recorder.snapshot() == stats
    True
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._live: dict[int, LoopCounts] = {}  # the counts of iterators still alive
        self._done = LoopCounts(clock)  # the sum of those of iterators gone
        self._bad_records: deque[BadRecord] = deque(maxlen=MAX_BAD_RECORDS)
        self._bad_record_count = 0
        self._tuning: Tuning | None = None

    def counts(self, iterator: object, *, loop: bool = True) -> LoopCounts:
        """New counts for `iterator` to update, added up with the others until it is collected
        and kept after; with `loop` False, of the sizes of its batches only."""
        counts = LoopCounts(self.clock, loop)
        with self._lock:
            self._live[id(counts)] = counts
        weakref.finalize(iterator, self._retire, counts)
        return counts

    def bad_record(self, record: BadRecord) -> None:
        """Note a record that a bad-record policy skipped or replaced."""
        with self._lock:
            self._bad_records.append(record)
            self._bad_record_count += 1

    def tuned(self, tuning: Tuning) -> None:
        """Note autotune's latest choice."""
        self._tuning = tuning

    @property
    def largest(self) -> int:
        """The bytes of the largest batch (or stream window) loaded so far; 0 before the first."""
        return self._total().largest

    def snapshot(
        self,
        workers: Mapping[str, WorkerStats] | None = None,
        left_out: Mapping[str, str] | None = None,
        reuse: ReuseStats | None = None,
    ) -> LoaderStats:
        """The numbers now, with a remote loader's `workers` in use and targets `left_out`, and
        what `reuse` saved."""
        now = self.clock()
        total = self._total()
        seconds = 0.0 if total.first is None else now - total.first
        batches, size, waited = total.batches, total.bytes, total.waited
        with self._lock:
            bad_records, bad_record_count = tuple(self._bad_records), self._bad_record_count
        return LoaderStats(
            batches=batches,
            bytes=size,
            seconds=seconds,
            waited_seconds=waited,
            batches_per_second=batches / seconds if seconds > 0 else 0.0,
            bytes_per_second=size / seconds if seconds > 0 else 0.0,
            wait_fraction=min(waited / seconds, 1.0) if seconds > 0 else 0.0,
            workers=dict(workers or {}),
            left_out=dict(left_out or {}),
            bad_records=bad_records,
            bad_record_count=bad_record_count,
            tuning=self._tuning,
            reuse=reuse or ReuseStats(),
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
