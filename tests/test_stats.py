"""`RemoteLoader.stats()`: batches, bytes, the training loop's wait, and per-worker numbers."""

from __future__ import annotations

import threading

import pipelines
from prometheus_client import CollectorRegistry

from loadax.client import LoaderStats, RemoteDataLoader, WorkerStats
from loadax.client.fleet_events import Answered, Joined, Left, Send, Submit
from loadax.client.fleet_options import FleetOptions
from loadax.client.fleet_stats import LATENCY_WINDOW, MemberCounts
from loadax.client.policy import Policy
from loadax.client.prometheus import LoaderCollector
from loadax.errors import WorkerError
from loadax.server.worker import Worker
from loadax.wire.v1 import worker_pb2 as wire


def test_worker_latencies_are_percentiles_of_a_bounded_recent_window() -> None:
    counts = MemberCounts()
    for seconds in range(1, 11):
        counts.sent()
        counts.answered(float(seconds))
    counts.failed("UNAVAILABLE: restarting")
    assert counts.stats(quarantined=None) == WorkerStats(
        requests=10,
        failures=1,
        last_error="UNAVAILABLE: restarting",
        latency_p50=5.0,
        latency_p90=9.0,
        latency_max=10.0,
    )
    assert MemberCounts().stats(None) == WorkerStats(0, 0, None, None, None, None)
    for _ in range(LATENCY_WINDOW):
        counts.answered(0.5)
    assert counts.stats(None).latency_max == 0.5  # the slow ones aged out


def test_a_member_that_left_is_forgotten_and_its_late_answers_ignored() -> None:
    policy = Policy(FleetOptions())
    policy.decide(Joined("a"), now=0.0)
    policy.decide(Joined("b"), now=0.0)
    (send,) = policy.decide(Submit(request=1, step=0), now=0.0)
    assert isinstance(send, Send)
    policy.decide(Left(send.member), now=0.5)
    assert send.member not in policy.member_stats()
    policy.decide(Answered(send.attempt), now=1.0)
    (other,) = policy.member_stats().values()
    assert (other.requests, other.latency_max) == (1, None)  # asked again, not answered yet


def test_a_remote_loader_counts_its_batches_bytes_and_requests() -> None:
    worker = Worker({"images": pipelines.images(records=40, side=12)}, threads=2)
    try:
        with RemoteDataLoader([worker], "images").batch_size(8).prefetch(2).build() as loader:
            (name,) = loader.targets
            before = loader.stats()
            assert (before.batches, before.seconds, before.wait_fraction) == (0, 0.0, 0.0)
            assert before.workers[name].requests == 0
            batches = list(loader)
            stats = loader.stats()
            loader.remove_target(name)
            assert loader.stats().workers == {}
    finally:
        worker.close()
    assert len(batches) == stats.batches == 5
    assert stats.bytes == sum(batch["image"].nbytes + batch["label"].nbytes for batch in batches)
    assert 0.0 <= stats.wait_fraction <= 1.0
    assert stats.seconds > 0
    numbers = stats.workers[name]
    assert (numbers.requests, numbers.failures, numbers.last_error) == (5, 0, None)
    assert numbers.latency_p50 is not None
    assert numbers.latency_p90 is not None
    assert numbers.latency_max is not None
    assert 0 <= numbers.latency_p50 <= numbers.latency_p90 <= numbers.latency_max


class FlakyWorker:
    """A worker whose first batch request fails as a restarting worker's would."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._failed = threading.Lock()

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        return self._worker.handshake(request)

    def load_batch(self, request: wire.BatchRequest) -> wire.BatchResponse:
        if self._failed.acquire(blocking=False):  # never released: once only
            raise WorkerError("UNAVAILABLE", "the worker is restarting")
        return self._worker.load_batch(request)


def test_a_worker_failure_is_counted_and_named() -> None:
    worker = Worker({"numbers": pipelines.numbers(records=16)}, threads=1)
    try:
        with RemoteDataLoader([FlakyWorker(worker)], "numbers").batch_size(4).build() as loader:
            assert len(list(loader)) == 4
            (numbers,) = loader.stats().workers.values()
    finally:
        worker.close()
    assert (numbers.requests, numbers.failures) == (5, 1)
    assert numbers.last_error == "UNAVAILABLE: the worker is restarting"


def test_the_collector_exposes_the_stats_to_prometheus() -> None:
    stats = LoaderStats(
        batches=7,
        bytes=700,
        seconds=10.0,
        waited_seconds=2.5,
        batches_per_second=0.7,
        bytes_per_second=70.0,
        wait_fraction=0.25,
        workers={
            "grpc://10.0.0.1:50051": WorkerStats(5, 1, "UNAVAILABLE: gone", 0.1, 0.2, 0.4),
            "grpc://10.0.0.2:50051": WorkerStats(
                0, 1, "NOT_FOUND: gone", None, None, None, "NOT_FOUND: gone"
            ),
        },
        left_out={"grpc://10.0.0.3:50051": "NOT_FOUND: unknown pipeline 'images'"},
        input_stall_fraction=0.125,
        workers_wanted=3,
    )
    registry = CollectorRegistry()
    registry.register(LoaderCollector(lambda: stats))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("loadax_client_batches_total") == 7
    assert value("loadax_client_bytes_total") == 700
    assert value("loadax_client_wait_seconds_total") == 2.5
    assert value("loadax_client_wait_fraction") == 0.25
    assert value("loadax_client_input_stall_fraction") == 0.125
    assert value("loadax_client_workers_wanted") == 3
    first, second = "grpc://10.0.0.1:50051", "grpc://10.0.0.2:50051"
    assert value("loadax_client_worker_requests_total", worker=first) == 5
    assert value("loadax_client_worker_failures_total", worker=first) == 1
    assert value("loadax_client_worker_requests_total", worker=second) == 0
    assert value("loadax_client_worker_quarantined", worker=first) == 0
    assert value("loadax_client_worker_quarantined", worker=second) == 1
    assert value("loadax_client_left_out_targets") == 1
    latency = "loadax_client_worker_latency_seconds"
    assert value(latency, worker=first, quantile="0.9") == 0.2
    assert value(latency, worker=first, quantile="1") == 0.4
    assert value(latency, worker=second, quantile="0.5") is None
