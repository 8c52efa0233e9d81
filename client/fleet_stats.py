"""A fleet member's counters behind `WorkerStats`: requests, failures, latencies, quarantine."""

from __future__ import annotations

import math
from collections import deque

from loadax.iterators.stats import WorkerStats

LATENCY_WINDOW = 1024
"""Per member, the latencies of this many most recent answers make its percentiles."""


class MemberCounts:
    """What one member was sent and how it answered, since the loader started using it.

    >>> counts = MemberCounts()
    >>> counts.sent(); counts.answered(0.25); counts.sent(); counts.failed("UNAVAILABLE: gone")
    >>> counts.stats(quarantined=None)
    WorkerStats(requests=2, failures=1, last_error='UNAVAILABLE: gone', latency_p50=0.25, \
latency_p90=0.25, latency_max=0.25, quarantined=None)
    """

    __slots__ = ("failures", "last_error", "latencies", "requests")

    def __init__(self) -> None:
        self.requests = self.failures = 0
        self.last_error: str | None = None
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def sent(self) -> None:
        self.requests += 1

    def answered(self, latency: float) -> None:
        self.latencies.append(latency)

    def failed(self, error: str) -> None:
        """A request it failed or did not answer in time."""
        self.failures += 1
        self.last_error = error

    def stats(self, quarantined: str | None) -> WorkerStats:
        ordered = sorted(self.latencies)
        return WorkerStats(
            requests=self.requests,
            failures=self.failures,
            last_error=self.last_error,
            latency_p50=_percentile(ordered, 0.5),
            latency_p90=_percentile(ordered, 0.9),
            latency_max=ordered[-1] if ordered else None,
            quarantined=quarantined,
        )


def _percentile(ordered: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of sorted values (None for none)."""
    if not ordered:
        return None
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]
