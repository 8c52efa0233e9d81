"""Every request a worker admits is let go of however it ends: a real `loadax-worker
--processes 2` after a storm of failing requests serves the next client at once, a client that
gave up its requests gets its slots back at once, and SIGTERM does not load what waits."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from workers import WorkerProcess, worker_process

import loadax
from loadax.client.transports import Reply
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.wire.failures import PipelineFailed
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

LIMIT = 16  # max_in_flight_per_client
BATCH_S = 1.0  # how long a batch of `slow` takes in a loader process: 2 records of 0.5 s
SLOTS = 2  # batches loading at once: the worker's threads and its processes
PIPELINES = """
[pipelines.ragged]
factory = "failure_pipelines:ragged"

[pipelines.numbers]
factory = "pipelines:numbers"

[pipelines.slow]
factory = "pipelines:slow"
args = { records = 64, delay = 0.5 }
"""
PLANS = {
    "ragged": loadax.Plan(64, batch_size=4),
    "numbers": loadax.Plan(100, batch_size=4),
    "slow": loadax.Plan(64, batch_size=2),
}
WAIT_S = 60.0
AT_ONCE_S = 5 * BATCH_S + 5.0
"""Served "at once": within a batch that was loading already, with a margin of 5."""


@pytest.fixture(params=["grpc", "zmq"])
def worker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkerProcess]:
    transport = request.param
    with worker_process(
        tmp_path,
        PIPELINES,
        grpc=transport == "grpc",
        zmq=transport == "zmq",
        threads=SLOTS,
        max_in_flight_per_client=2 * LIMIT,
        args=["--processes", str(SLOTS), "--metrics", "127.0.0.1:0"],
    ) as running:
        yield running


def wait_in_flight(worker: WorkerProcess, count: int) -> None:
    """Block until `count` requests are being answered by `worker` (its metrics say)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with opener.open(f"http://{worker.metrics}/metrics", timeout=WAIT_S) as page:
            text = page.read().decode()
        in_flight = sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "loadax_worker_in_flight"
        )
        if in_flight >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{worker} never had {count} requests in flight")


class Client:
    """One client of `worker` over its transport, asking for batches of the pipelines above."""

    def __init__(self, worker: WorkerProcess) -> None:
        if worker.grpc is not None:
            self.transport: GrpcTransport | ZmqTransport = GrpcTransport(worker.grpc)
        else:
            self.transport = ZmqTransport(worker.address("zmq"))
        self._fingerprints: dict[str, str] = {}

    def send(self, pipeline: str, step: int) -> Future[Reply]:
        plan = PLANS[pipeline]
        if pipeline not in self._fingerprints:
            self._fingerprints[pipeline] = self.transport.handshake(
                wire.HandshakeRequest(
                    library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(plan)
                )
            ).fingerprint
        fingerprint = self._fingerprints[pipeline]
        return self.transport.send(batch_request(pipeline, fingerprint, plan, StepWork(step)))

    def served_at_once(self) -> None:
        """A batch of `numbers` comes back on the first request, within `AT_ONCE_S`."""
        started = time.monotonic()
        self.send("numbers", 0).result(AT_ONCE_S)
        assert time.monotonic() - started < AT_ONCE_S

    def close(self) -> None:
        self.transport.close()


def test_after_a_storm_of_failures_clients_are_served_at_once_and_a_stop_is_prompt(
    worker: WorkerProcess,
) -> None:
    """Requests whose batch the pipeline cannot make hold nothing once answered: the same
    client and a new one are served at once. Then 2 x LIMIT batches of a second each, 2 loading
    at once (a queue of 16 s): SIGTERM finishes those loading and refuses those waiting."""
    client = Client(worker)
    try:
        for _ in range(4):
            storm = [client.send("ragged", step % 16) for step in range(2 * LIMIT)]
            for answer in storm:
                assert isinstance(answer.exception(WAIT_S), PipelineFailed)
        client.served_at_once()
        other = Client(worker)
        other.served_at_once()
        other.close()
        waiting = [client.send("slow", step) for step in range(2 * LIMIT)]
        wait_in_flight(worker, SLOTS)  # loading; the rest wait (for a slot, or a handler)
        started = time.monotonic()
        assert worker.terminate(WAIT_S) == 0
        assert time.monotonic() - started < AT_ONCE_S
        errors = [answer.exception(WAIT_S) for answer in waiting]
    finally:
        client.close()
    loaded = [error for error in errors if error is None]
    assert 1 <= len(loaded) <= 2 * SLOTS
    # Told to ask elsewhere (a gRPC call may end CANCELLED as the server goes).
    refused = {getattr(error, "code", error) for error in errors if error is not None}
    assert refused
    assert refused <= {"UNAVAILABLE", "CANCELLED"}


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_requests_a_client_gave_up_free_its_slots_at_once(tmp_path: Path, transport: str) -> None:
    """The worker hears of a cancelled request (gRPC: the call ends; ZeroMQ: a Cancel frame):
    what waited to load is let go of, and the client's next request is admitted and served."""
    with worker_process(
        tmp_path,
        PIPELINES,
        grpc=transport == "grpc",
        zmq=transport == "zmq",
        threads=SLOTS,
        max_in_flight_per_client=LIMIT,
        args=["--processes", str(SLOTS), "--metrics", "127.0.0.1:0"],
    ) as worker:
        client = Client(worker)
        try:
            given_up = [client.send("slow", step) for step in range(LIMIT)]
            # gRPC counts every call in flight; ZeroMQ those loading (the rest wait a handler).
            wait_in_flight(worker, LIMIT if transport == "grpc" else SLOTS)
            for answer in given_up:
                answer.cancel()
            try:
                client.served_at_once()
            except WorkerError as error:
                pytest.fail(f"the client was refused after cancelling: {error}")
        finally:
            client.close()
        started = time.monotonic()
        assert worker.terminate(WAIT_S) == 0
        assert time.monotonic() - started < AT_ONCE_S
