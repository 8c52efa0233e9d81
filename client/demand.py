"""The demand signal a fleet is sized from: how fast the training loop would take batches if never
kept waiting, how much of its recent time it waited, and `workers_wanted`, the remote workers
that would keep that wait under a target with one to spare (`RemoteLoader.stats()`).

A member's capacity is what it delivers when kept busy: the requests this loader keeps at it
over its median latency (Little's law), so that a fleet larger than needed, whose members idle
part of the time, is not mistaken for a slow one. Local members' capacity comes off the demand
first: the trainer's own cores are used before workers are asked for.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Mapping

from loadax.client.fleet_watch import is_local
from loadax.iterators.stats import LoaderStats

DEFAULT_STALL_TARGET = 0.02
"""The share of its time the training loop may wait for batches, by default."""
DEFAULT_WINDOW_S = 10.0
"""Seconds of the recent past the demand and the stall are measured over, by default."""


def workers_wanted(
    demand: float, capacities: Mapping[str, float], stall_target: float = DEFAULT_STALL_TARGET
) -> int | None:
    """The remote workers, each delivering what the remote members do on average, that with the
    local members' capacity keep a loop of `demand` batches per second waiting under
    `stall_target` of its time, plus one for a failure (0 when local members suffice); None
    before a remote member has answered.

    >>> workers_wanted(100.0, {"grpc://a": 40.0, "grpc://b": 40.0})
    4
    >>> workers_wanted(100.0, {"grpc://a": 40.0, "local 0": 30.0})
    3
    >>> workers_wanted(20.0, {"grpc://a": 40.0, "local 0": 30.0})
    0
    """
    remote = [rate for name, rate in capacities.items() if not is_local(name)]
    if not remote:
        return None
    local = sum(rate for name, rate in capacities.items() if is_local(name))
    # A loop that waits w of its time takes (1 - w) of the batches it would: that many suffice.
    needed = max(demand * (1 - stall_target) - local, 0.0) / (sum(remote) / len(remote))
    workers = math.ceil(needed - 1e-9)
    return workers + 1 if workers else 0


@dataclasses.dataclass(frozen=True, slots=True)
class Demand:
    """The loop's recent numbers: `stall` (the share of the time it waited), `demand` (batches
    per second it would take if never kept waiting, 0 before its first) and `workers_wanted`."""

    stall: float
    demand: float
    workers_wanted: int | None


class DemandMeter:
    """Measures the demand over the last `window` seconds between the loader's stats snapshots
    (the newest snapshot at least that old is the window's start; before one, the first
    request), with `stall_target` for `workers_wanted`.

    >>> from loadax.iterators.stats import StatsRecorder
    >>> meter = DemandMeter(window=10.0)
    >>> stats = StatsRecorder().snapshot()
    >>> seen = dataclasses.replace(stats, batches=50, seconds=10.0, waited_seconds=5.0)
    >>> meter.measure(seen, {"grpc://a": 4.0}, now=10.0)
    Demand(stall=0.5, demand=10.0, workers_wanted=4)
    """

    def __init__(
        self, stall_target: float = DEFAULT_STALL_TARGET, window: float = DEFAULT_WINDOW_S
    ) -> None:
        self.stall_target, self.window = stall_target, window
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int, float]] = deque()  # (when, batches, waited)

    def measure(self, stats: LoaderStats, capacities: Mapping[str, float], now: float) -> Demand:
        """The demand `stats` (a snapshot taken at `now`) shows, with the members' capacities."""
        with self._lock:
            self._samples.append((now, stats.batches, stats.waited_seconds))
            while len(self._samples) > 1 and now - self._samples[1][0] >= self.window:
                self._samples.popleft()
            since, batches, waited = self._samples[0]
        if now - since < self.window:  # no snapshot that old: since the first request
            since, batches, waited = now - stats.seconds, 0, 0.0
        seconds = now - since
        waited = stats.waited_seconds - waited
        batches = stats.batches - batches
        busy = seconds - waited
        demand = batches / busy if batches and busy > 0 else 0.0
        stall = min(waited / seconds, 1.0) if seconds > 0 else 0.0
        wanted = workers_wanted(demand, capacities, self.stall_target) if demand else None
        return Demand(stall, demand, wanted)
