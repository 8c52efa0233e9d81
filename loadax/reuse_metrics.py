"""`ReuseStats` as Prometheus metrics, for the worker's exporter and a client's collector.

Needs prometheus-client (`pip install 'loadax[worker]'`), like the modules that use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from loadax.reuse import ReuseStats


def reuse_metrics(prefix: str, stats: ReuseStats) -> Iterator[Metric]:
    """The counters `{prefix}_hits`, `_misses`, `_coalesced`, `_bytes_saved` and the gauge
    `_cache_bytes`."""
    yield CounterMetricFamily(f"{prefix}_hits", "Answers served from a cache.", stats.hits)
    yield CounterMetricFamily(f"{prefix}_misses", "Answers computed.", stats.misses)
    yield CounterMetricFamily(
        f"{prefix}_coalesced",
        "Answers of a computation that another request with the same digest started.",
        stats.coalesced,
    )
    yield CounterMetricFamily(
        f"{prefix}_bytes_saved", "Bytes of the answers not computed again.", stats.bytes_saved
    )
    yield GaugeMetricFamily(f"{prefix}_cache_bytes", "Bytes the cache holds.", stats.size_bytes)


class ReuseCollector:
    """`reuse_metrics(prefix, stats())`, read at every scrape."""

    def __init__(self, prefix: str, stats: Callable[[], ReuseStats]) -> None:
        self._prefix = prefix
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        return reuse_metrics(self._prefix, self._stats())
