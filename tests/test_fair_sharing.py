"""A worker shares its loading threads fairly between its clients, and tells them apart by the id
each loader sends: one real `loadax-worker` (one loading thread, gRPC and ZeroMQ) and loaders in
this process, which share a gRPC connection. Its handler threads leave once a crowd has gone."""

from __future__ import annotations

import doctest
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from workers import WorkerProcess, worker_process

import loadax
import loadax.server.handler_pool
import loadax.server.request_path
from loadax.client import RemoteDataLoader
from loadax.client.transports import Reply
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server.handler_pool import IDLE_S
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

LIMIT = 16  # the worker's max_in_flight_per_client
PIPELINES = """
[pipelines.paced]
factory = "pipelines:paced"
args = { records = 100000, delay = 0.02 }
"""
PLAN = loadax.Plan(100000, batch_size=2)  # a batch: 2 records of 20 ms, on the one thread
MEASURE_S = 2.5
FAIR = 1.25
"""The most a client may get over another while both are backlogged, in batches of one size."""
WAIT_S = 60.0
RETURN_S = 5 * (IDLE_S + 1.0)
"""How long the handler threads may take to leave once a crowd has gone: 5x the time expected."""
CROWD = 96  # requests of 8 clients waiting at once


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(
        tmp_path_factory.mktemp("worker"),
        PIPELINES,
        grpc=True,
        zmq=True,
        threads=1,
        max_in_flight_per_client=LIMIT,
    ) as running:
        yield running


def test_the_fair_queue_examples() -> None:
    for module in (loadax.server.request_path, loadax.server.handler_pool):
        assert doctest.testmod(module).failed == 0


class Reading:
    """A loader read without pause on a thread of its own, counting its batches."""

    def __init__(self, loader: loadax.Loader[Any]) -> None:
        self.batches = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(loader,))
        self._thread.start()

    def _read(self, loader: loadax.Loader[Any]) -> None:
        try:
            with iter(loader) as iterator:
                while not self._stop.is_set():
                    next(iterator)
                    self.batches += 1
        except BaseException as error:
            self._error = error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        if self._error is not None:
            raise self._error


def read_at_once(loaders: list[Any], seconds: float = MEASURE_S) -> list[int]:
    """The batches each of `loaders` reads in the same `seconds`, all reading without pause
    (and each past its first batches) throughout."""
    readings = [Reading(loader) for loader in loaders]
    try:
        deadline = time.monotonic() + WAIT_S
        while min(reading.batches for reading in readings) < 2:
            assert time.monotonic() < deadline, "a loader got no batches"
            time.sleep(0.05)
        before = [reading.batches for reading in readings]
        time.sleep(seconds)
        return [reading.batches - first for reading, first in zip(readings, before, strict=True)]
    finally:
        for reading in readings:
            reading.stop()


def remote(worker: WorkerProcess, transport: str, seed: int = 0) -> RemoteDataLoader:
    """A loader of batches of 2. Loaders that ask for the same batches share them (the worker
    computes each once and caches it, `loadax.server.share_cache`), so each loader compared
    for fairness has a seed of its own, on each transport."""
    loader = RemoteDataLoader([worker.address(transport)], pipeline="paced").batch_size(2)
    return loader.shuffle(seed=seed + (1000 if transport == "zmq" else 0))


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_client_asking_for_more_in_flight_gets_no_larger_share(
    worker: WorkerProcess, transport: str
) -> None:
    """Two loaders of one process, one keeping 16 requests at the worker and one 2: both
    backlogged, the worker's one loading thread serves them in turn (by arrival, the first
    would get 8 batches of every 9)."""
    greedy = remote(worker, transport, seed=1).in_flight_per_worker(LIMIT).build()
    modest = remote(worker, transport, seed=2).build()
    with greedy, modest:
        counts = read_at_once([greedy, modest])
    assert min(counts) > 0
    assert max(counts) <= FAIR * min(counts), f"greedy {counts[0]}, default {counts[1]} batches"


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_loaders_sharing_a_connection_are_not_refused_as_one_client(
    worker: WorkerProcess, transport: str
) -> None:
    """Six loaders of one process (over gRPC, one connection) with 4 requests each in flight:
    24 together, more than one client may have (16); each is served, and none is refused."""
    printed = len(worker.output())
    loaders = [
        remote(worker, transport, seed).in_flight_per_worker(4).build() for seed in range(10, 16)
    ]
    try:
        read_at_once(loaders, seconds=0.5)
    finally:
        for loader in loaders:
            loader.close()
    assert "RESOURCE_EXHAUSTED" not in worker.output()[printed:]


class Client:
    """A client of `worker` over `transport` that sends batch requests as it is told."""

    def __init__(self, worker: WorkerProcess, transport: str) -> None:
        if transport == "grpc":
            self.transport: GrpcTransport | ZmqTransport = GrpcTransport(worker.grpc_address)
        else:
            self.transport = ZmqTransport(worker.address("zmq"))
        handshake = wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline="paced", plan=plan_to_wire(PLAN)
        )
        self.fingerprint = self.transport.handshake(handshake).fingerprint

    def send(self, step: int, client: str) -> Future[Reply]:
        work = StepWork(step)
        return self.transport.send(batch_request("paced", self.fingerprint, PLAN, work, client))


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_request_without_a_client_id_is_served_and_an_overlong_id_is_refused(
    worker: WorkerProcess, transport: str
) -> None:
    client = Client(worker, transport)
    try:
        assert client.send(3, "").result(WAIT_S).header.step == 3
        error = client.send(4, "x" * 129).exception(WAIT_S)
    finally:
        client.transport.close()
    assert isinstance(error, WorkerError)
    assert error.code == "INVALID_ARGUMENT"
    assert "client id is 129 characters long" in error.message


def threads_of(worker: WorkerProcess) -> int:
    return len(os.listdir(f"/proc/{worker.process.pid}/task"))


def steady_threads(worker: WorkerProcess) -> int:
    """The worker's thread count once it has not changed for longer than handler threads idle."""
    deadline = time.monotonic() + WAIT_S
    count, since = threads_of(worker), time.monotonic()
    while time.monotonic() - since < 1.2 * IDLE_S:
        assert time.monotonic() < deadline, "the worker's thread count never settled"
        time.sleep(0.1)
        now = threads_of(worker)
        if now != count:
            count, since = now, time.monotonic()
    return count


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_the_worker_threads_return_to_their_idle_count_after_a_crowd_leaves(
    worker: WorkerProcess, transport: str
) -> None:
    """96 requests of 8 clients wait at once, each on a handler thread of the worker; once they
    are cancelled, the worker's threads are back to within a few of its idle count."""
    idle = steady_threads(worker)
    client = Client(worker, transport)
    try:
        waiting = [client.send(step, f"client {step % 8}") for step in range(CROWD)]
        deadline = time.monotonic() + WAIT_S
        while threads_of(worker) < idle + CROWD // 2:
            assert time.monotonic() < deadline, f"{threads_of(worker)} threads, idle {idle}"
            time.sleep(0.05)
        for answer in waiting:
            answer.cancel()
    finally:
        client.transport.close()
    deadline = time.monotonic() + RETURN_S
    while threads_of(worker) > idle + 4:
        assert time.monotonic() < deadline, f"{threads_of(worker)} threads, idle {idle}"
        time.sleep(0.1)
