"""A loader's stats as Prometheus metrics, for trainers that export their own.

Needs prometheus-client (`pip install 'loadax[worker]'`); the rest of the client does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from loadax.iterators.stats import LoaderStats
from loadax.reuse_metrics import reuse_metrics


class LoaderCollector:
    """Reads `stats()` (e.g. `RemoteLoader.stats`) at every scrape:
    `prometheus_client.REGISTRY.register(LoaderCollector(loader.stats))`.

    Rates are left to Prometheus (`rate(loadax_client_batches_total[1m])`). A remote loader's
    `loadax_client_workers_wanted` is what an autoscaler sizes the worker fleet from (the sum
    over trainers: deploy/kubernetes/autoscale).
    """

    def __init__(self, stats: Callable[[], LoaderStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield CounterMetricFamily(
            "loadax_client_batches", "Batches the training loop got.", value=stats.batches
        )
        yield CounterMetricFamily(
            "loadax_client_bytes", "Array bytes of the batches it got.", value=stats.bytes
        )
        yield CounterMetricFamily(
            "loadax_client_wait_seconds",
            "Time the training loop waited for batches.",
            value=stats.waited_seconds,
        )
        yield GaugeMetricFamily(
            "loadax_client_wait_fraction",
            "Share of the time since the first request the training loop waited for batches.",
            value=stats.wait_fraction,
        )
        if stats.input_stall_fraction is not None:
            yield GaugeMetricFamily(
                "loadax_client_input_stall_fraction",
                "Share of the recent time (RemoteDataLoader.sizing's window) the training loop "
                "waited for batches.",
                value=stats.input_stall_fraction,
            )
        if stats.workers_wanted is not None:
            yield GaugeMetricFamily(
                "loadax_client_workers_wanted",
                "Remote workers that would keep this loader's input stall under its target, "
                "with one to spare: size the worker fleet from the sum over trainers.",
                value=stats.workers_wanted,
            )
        requests = CounterMetricFamily(
            "loadax_client_worker_requests", "Requests sent to each worker.", labels=["worker"]
        )
        failures = CounterMetricFamily(
            "loadax_client_worker_failures",
            "Requests each worker failed or did not answer in time.",
            labels=["worker"],
        )
        quarantined = GaugeMetricFamily(
            "loadax_client_worker_quarantined",
            "1 while a worker is quarantined (wrong for this loader, kept off), else 0.",
            labels=["worker"],
        )
        latency = GaugeMetricFamily(
            "loadax_client_worker_latency_seconds",
            "Each worker's answer latency over its recent answers (quantile 1: the maximum).",
            labels=["worker", "quantile"],
        )
        for name, worker in stats.workers.items():
            requests.add_metric([name], worker.requests)
            failures.add_metric([name], worker.failures)
            quarantined.add_metric([name], 0 if worker.quarantined is None else 1)
            quantiles = (
                ("0.5", worker.latency_p50),
                ("0.9", worker.latency_p90),
                ("1", worker.latency_max),
            )
            for quantile, seconds in quantiles:
                if seconds is not None:
                    latency.add_metric([name, quantile], seconds)
        yield from (requests, failures, quarantined, latency)
        yield GaugeMetricFamily(
            "loadax_client_left_out_targets",
            "Targets left out for what they answered the handshake (another pipeline identity, "
            "no such pipeline, an incompatible version).",
            value=len(stats.left_out),
        )
        # A local loader's cache() ops, or what its workers built for others' requests.
        yield from reuse_metrics("loadax_client_reuse", stats.reuse)
