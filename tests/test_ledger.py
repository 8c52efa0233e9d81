"""One ledger, one request path: what a worker holds for a client, on either transport, counts
until the reply has left, and is let go of whatever the outcome (a batch sent, a record that
failed, a refusal, a client that cancelled or went away). Real servers on 127.0.0.1, in this
process, so that their ledgers can be read."""

from __future__ import annotations

import doctest
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pipelines
import pytest
import zmq

import loadax
import loadax.server.ledger
from loadax.dataset.ops import DatasetBase
from loadax.errors import WorkerError
from loadax.plan.permutation import IndexArray
from loadax.server.grpc_server import GrpcServer
from loadax.server.ledger import Ledger
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_frames
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

WAIT_S = 10.0
PLAN = loadax.Plan(20, batch_size=4)
BUDGET = 64 << 20


class GatedDataset(DatasetBase[int]):
    """Reads block until `gate` opens; `started` tells that a read began."""

    def __init__(self, records: int) -> None:
        self.started, self.gate = threading.Event(), threading.Event()
        self._records = records

    def __len__(self) -> int:
        return self._records

    def read(self, indices: IndexArray, epoch: int) -> list[int]:
        self.started.set()
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return indices.tolist()


@pytest.fixture
def gated() -> Iterator[GatedDataset]:
    dataset = GatedDataset(20)
    dataset.gate.set()  # the worker reads a probe batch of each pipeline at start
    yield dataset
    dataset.gate.set()  # before the server stops, so that no handler stays blocked


@pytest.fixture
def worker(gated: GatedDataset) -> Iterator[Worker]:
    worker = Worker(
        {
            "numbers": pipelines.numbers(20),
            "failing": pipelines.failing(20, bad=7),
            "gated": loadax.Pipeline(gated, loadax.Batcher()),
        },
        memory_budget_bytes=BUDGET,
    )
    gated.gate.clear()
    gated.started.clear()
    yield worker
    worker.close()


class Client:
    """Batch requests over one transport: `ask` waits for the answer (a code), `start` does
    not, and `cancel` gives up what was started (gRPC cancels the call, a ZeroMQ client goes)."""

    def __init__(self, transport: str, endpoint: str) -> None:
        self.transport = transport
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._started: Any = None
        if transport == "grpc":
            self._channel = grpc.insecure_channel(endpoint)
            self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        else:
            self._endpoint = endpoint
            self._dealer = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        dealer = self._context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.rcvtimeo = int(WAIT_S * 1000)
        dealer.connect(self._endpoint)
        return dealer

    def ask(self, request: wire.BatchRequest | wire.HandshakeRequest) -> str:
        if self.transport == "grpc":
            method = self._stub.LoadBatch
            if isinstance(request, wire.HandshakeRequest):
                method = self._stub.Handshake
            try:
                method(request, timeout=WAIT_S)
            except grpc.RpcError as error:
                return str(error.code().name)
            return "OK"
        self._dealer.send_multipart(zmq_frames.request_frames(1, request))
        frames = self._dealer.recv_multipart()
        try:
            if isinstance(request, wire.HandshakeRequest):
                zmq_frames.parse_reply(frames, wire.HandshakeResponse)
            else:
                zmq_frames.parse_batch_reply(frames)
        except WorkerError as error:
            return error.code
        return "OK"

    def start(self, request: wire.BatchRequest) -> None:
        if self.transport == "grpc":
            self._started = self._stub.LoadBatch.future(request, timeout=WAIT_S)
        else:
            self._dealer.send_multipart(zmq_frames.request_frames(2, request))

    def cancel(self) -> None:
        if self.transport == "grpc":
            self._started.cancel()
        else:
            self._dealer.close(linger=0)
            self._dealer = self._connect()

    def close(self) -> None:
        if self.transport == "grpc":
            self._channel.close()
        else:
            self._dealer.close(linger=0)
        self._context.term()


Served = tuple[Ledger, Client]


@pytest.fixture(params=["grpc", "zmq"])
def served(request: pytest.FixtureRequest, worker: Worker, gated: GatedDataset) -> Iterator[Served]:
    options = {"threads": 2, "max_in_flight_per_client": 1}
    server: GrpcServer | ZmqServer
    if request.param == "grpc":
        server = GrpcServer(worker, "127.0.0.1:0", **options)
    else:
        server = ZmqServer(worker, "tcp://127.0.0.1:0", **options)
    client = Client(request.param, server.start())
    try:
        yield server.ledger, client
    finally:
        gated.gate.set()
        client.close()
        server.stop(grace=WAIT_S)


def batch(worker: Worker, pipeline: str, step: int = 0) -> wire.BatchRequest:
    handshake = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(PLAN)
    )
    return wire.BatchRequest(
        pipeline=pipeline,
        fingerprint=worker.handshake(handshake).fingerprint,
        plan=plan_to_wire(PLAN),
        step=step,
    )


def eventually(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def assert_let_go(ledger: Ledger, worker: Worker) -> None:
    """Nothing is held for any client any more: no request, no byte, no budget."""
    budget = worker.memory_budget
    assert budget is not None

    def state() -> tuple[int, int, int, int]:
        return ledger.held, ledger.in_flight, ledger.held_bytes, budget.reserved

    assert eventually(lambda: state() == (0, 0, 0, 0)), f"still held: {state()}"


def test_a_batch_sent_is_let_go_of(served: Served, worker: Worker) -> None:
    ledger, client = served
    assert client.ask(batch(worker, "numbers")) == "OK"
    assert_let_go(ledger, worker)


def test_a_failing_record_is_let_go_of(served: Served, worker: Worker) -> None:
    ledger, client = served
    assert client.ask(batch(worker, "failing", step=1)) == "ABORTED"  # records 4-7
    assert_let_go(ledger, worker)
    assert client.ask(batch(worker, "failing", step=0)) == "OK"  # its limit is free again
    assert_let_go(ledger, worker)


def test_a_request_refused_before_loading_is_let_go_of(served: Served, worker: Worker) -> None:
    ledger, client = served
    wrong = batch(worker, "numbers")
    wrong.fingerprint = "0" * 64
    assert client.ask(wrong) == "FAILED_PRECONDITION"
    unknown = wire.HandshakeRequest(library_version=loadax.__version__, pipeline="nowhere")
    assert client.ask(unknown) == "NOT_FOUND"
    assert_let_go(ledger, worker)


def test_a_request_is_held_while_it_loads_and_over_the_limit_is_refused(
    served: Served, worker: Worker, gated: GatedDataset
) -> None:
    ledger, client = served
    client.start(batch(worker, "gated"))
    assert gated.started.wait(WAIT_S)
    assert ledger.in_flight == 1
    assert worker.memory_budget is not None
    assert worker.memory_budget.reserved > 0
    assert client.ask(batch(worker, "numbers")) == "RESOURCE_EXHAUSTED"
    assert ledger.in_flight == 1
    gated.gate.set()
    assert_let_go(ledger, worker)


def test_a_request_its_client_gave_up_is_let_go_of(
    served: Served, worker: Worker, gated: GatedDataset
) -> None:
    ledger, client = served
    client.start(batch(worker, "gated"))
    assert gated.started.wait(WAIT_S)
    client.cancel()
    gated.gate.set()
    assert_let_go(ledger, worker)
    assert client.ask(batch(worker, "numbers")) == "OK"
    assert_let_go(ledger, worker)


def test_the_ledgers_examples_run() -> None:
    failed, _ = doctest.testmod(loadax.server.ledger)
    assert failed == 0
