"""`loadax.client.transports`: one registry by URL scheme, transports that hand over a reply's
bytes unverified, and `ReplyDecoder.verify`, the one place above them that checks a reply and
maps its failure to what the training loop sees."""

from __future__ import annotations

import dataclasses
import doctest
import threading
from collections.abc import Iterator
from concurrent.futures import CancelledError, Future
from typing import Any

import numpy as np
import pipelines
import pytest
from verifying import Verifying

import loadax
import loadax.client.transports.reply
from loadax import Plan, RecordError
from loadax.client.replies import ReplyDecoder
from loadax.client.transports import TRANSPORTS, Reply, check_spec, connect
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.in_process import InProcessTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import RemoteCause, WorkerError
from loadax.plan.work import StepWork
from loadax.server.worker import Worker
from loadax.wire.failures import RecordFailed
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

PLAN = Plan(20, batch_size=4)
WAIT_S = 30.0


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    worker = Worker({"numbers": pipelines.numbers(20), "failing": pipelines.failing(20, 7)})
    yield worker
    worker.close()


def hello(pipeline: str = "numbers") -> wire.HandshakeRequest:
    return wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(PLAN)
    )


def test_each_scheme_has_one_transport() -> None:
    assert dict(TRANSPORTS) == {"grpc": GrpcTransport, "zmq": ZmqTransport}
    for address, kind in (
        ("grpc://127.0.0.1:1", GrpcTransport),
        ("zmq://127.0.0.1:1", ZmqTransport),
    ):
        transport = connect(address)
        try:
            assert isinstance(transport, kind)
            assert transport.name == address
        finally:
            transport.close()


def test_a_worker_object_is_reached_in_process(worker: Worker) -> None:
    transport = connect(worker)
    try:
        assert isinstance(transport, InProcessTransport)
        assert transport.name == "in-process Worker"
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("http://localhost:1", "must start with grpc:// or zmq://"),
        ("tcp://localhost:1", "must start with grpc:// or zmq://"),
        ("grpc", "must start with grpc:// or zmq://"),
        (42, "address or a worker object, got int"),
    ],
)
def test_what_no_transport_reaches_is_a_value_error(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_spec(spec)
    with pytest.raises(ValueError, match=message):
        connect(spec)


def test_the_zeromq_transport_also_takes_tcp_addresses() -> None:
    ZmqTransport("tcp://127.0.0.1:1").close()


def test_a_handshake_is_the_workers_answer_as_it_is(worker: Worker) -> None:
    transport = InProcessTransport(worker)
    try:
        assert transport.handshake(hello()) == worker.handshake(hello())
    finally:
        transport.close()


def test_a_reply_is_the_workers_header_and_frames_unverified(worker: Worker) -> None:
    """In process, the frames are the worker's own (no copy), and the worker's memory budget
    lets go of the reply once it is handed over: they stay valid, as Python objects."""
    released = threading.Event()

    class Releasing:
        def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
            return worker.handshake(request)

        def load_batch(self, request: wire.BatchRequest) -> EncodedBatch:
            answer = worker.load_batch(request)
            self.frames = answer.frames
            return dataclasses.replace(answer, release=released.set)

    releasing = Releasing()
    transport = InProcessTransport(releasing)
    try:
        fingerprint = transport.handshake(hello()).fingerprint
        request = batch_request("numbers", fingerprint, PLAN, StepWork(2))
        reply = transport.send(request).result(WAIT_S)
    finally:
        transport.close()
    assert released.is_set()
    assert isinstance(reply, Reply)
    assert reply.payload is releasing.frames
    decoder = ReplyDecoder(transport.name)
    batch = decoder.decode(request, reply.header, reply.payload)
    np.testing.assert_array_equal(batch["y"], [16, 18, 20, 22])


def finished(outcome: Reply | BaseException | None) -> Future[Reply]:
    """A finished future of `outcome` (None: cancelled)."""
    future: Future[Reply] = Future()
    if outcome is None:
        future.cancel()
    elif isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
    return future


def test_verify_decodes_a_reply_that_passes_every_check(worker: Worker) -> None:
    decoder = ReplyDecoder("worker-a")
    fingerprint = decoder.learn(worker.handshake(hello())).fingerprint
    request = batch_request("numbers", fingerprint, PLAN, StepWork(1))
    answer = worker.load_batch(request)
    batch = decoder.verify(request, finished(Reply(answer.header, answer.frames)))
    np.testing.assert_array_equal(batch["y"], [8, 10, 12, 14])
    other = batch_request("numbers", fingerprint, PLAN, StepWork(2))
    with pytest.raises(WorkerError, match="sent a bad reply to step 2: it answers another"):
        decoder.verify(other, finished(Reply(answer.header, answer.frames)))


def test_verify_raises_the_loaders_error_for_a_failed_reply() -> None:
    decoder = ReplyDecoder("worker-a")
    request = wire.BatchRequest(step=1)
    unavailable = WorkerError("UNAVAILABLE", "lost the connection to worker-a")
    with pytest.raises(WorkerError) as raised:
        decoder.verify(request, finished(unavailable))
    assert raised.value is unavailable
    # A failed record is the RecordError a local loader raises, with the worker's cause.
    failed = RecordFailed.of(RecordError(7, 0, ValueError("record 7 is corrupt")), "Traceback")
    with pytest.raises(RecordError) as record:
        decoder.verify(request, finished(failed))
    assert (record.value.index, record.value.epoch) == (7, 0)
    assert isinstance(record.value.__cause__, RemoteCause)
    # A transport's bug is raised as it is, never taken for a worker's failure.
    with pytest.raises(KeyError):
        decoder.verify(request, finished(KeyError("bug")))


def test_verify_raises_cancelled_for_a_cancelled_reply_and_refuses_one_not_done() -> None:
    decoder = ReplyDecoder("worker-a")
    with pytest.raises(CancelledError):
        decoder.verify(wire.BatchRequest(), finished(None))
    with pytest.raises(ValueError, match="once it is done"):
        decoder.verify(wire.BatchRequest(), Future())


def test_a_failed_record_travels_as_it_is_and_is_verified_into_the_record_error(
    worker: Worker,
) -> None:
    target = Verifying(InProcessTransport(worker))
    try:
        fingerprint = target.handshake(hello("failing")).fingerprint
        (step,) = [s for s in range(5) if 7 in PLAN.indices(s).tolist()]
        request = batch_request("failing", fingerprint, PLAN, StepWork(step))
        reply = target.transport.send(request)
        assert isinstance(reply.exception(WAIT_S), RecordFailed)
        with pytest.raises(RecordError):
            target.verify(request, reply)
    finally:
        target.close()


def test_the_examples_of_the_reply_module_run() -> None:
    failed, tried = doctest.testmod(loadax.client.transports.reply)
    assert tried > 0
    assert failed == 0
