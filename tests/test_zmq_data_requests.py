"""Batch requests and cancels on a ZeroMQ worker's data socket (`loadax.wire.zmq_data`): a worker
that says so at the handshake takes them there as from the connection that shook hands, without
the token; a client sends them there, and on its DEALER to a worker that does not."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import assert_batches_equal
from test_zmq_cancel import Gate, wait_until
from test_zmq_data import (
    NUMBERS,
    PLAN,
    SERVED,
    TOKEN,
    WAIT_S,
    OpenedZmq,
    expected,
    handshake_request,
    load,
    sent_on_data_sockets,
    worker,
)
from workers import worker_process

import loadax
from loadax.client.security import ClientSecurity
from loadax.client.transports.zmq_data import open_data_socket
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server import zmq_server
from loadax.server.worker import Worker
from loadax.server.zmq_data import DataPort
from loadax.server.zmq_server import ZmqServer
from loadax.server.zmq_service import ZmqService
from loadax.wire import zmq_data, zmq_frames
from loadax.wire.codec import decode_frames
from loadax.wire.messages import method_of
from loadax.wire.plans import batch_request
from loadax.wire.v1 import worker_pb2 as wire

__all__ = ["sent_on_data_sockets", "worker"]  # fixtures
LOAD_BATCH = method_of(wire.BatchRequest()).encode()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bytes]]:
    """Every message a ZeroMQ worker takes from now on: whether it came on a data socket, and
    its method frame."""
    seen: list[tuple[bool, bytes]] = []
    take = ZmqService.take

    def counted(self: ZmqService, identity: bytes, frames: Any, data_socket: bool = False) -> Any:
        seen.append((data_socket, bytes(frames[1]) if len(frames) > 1 else b""))
        return take(self, identity, frames, data_socket)

    monkeypatch.setattr(ZmqService, "take", counted)
    return seen


class RawClient:
    """A DEALER that shook hands with a worker (with `TOKEN`), and the data socket it offered,
    blocking: requests go on either, refusals come on the DEALER, batches on the data socket."""

    def __init__(self, endpoint: str, pipeline: str, plan: loadax.Plan) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.dealer = self._context.socket(zmq.DEALER)
        self.dealer.linger = 0
        self.dealer.rcvtimeo = int(WAIT_S * 1000)
        self.dealer.connect(endpoint)
        asked = handshake_request(pipeline, plan)
        asked.data_socket = True
        self.dealer.send_multipart(zmq_frames.request_frames(0, asked, TOKEN))
        self.response = zmq_frames.parse_reply(
            self.dealer.recv_multipart(), wire.HandshakeResponse
        ).response
        peer = open_data_socket(endpoint.replace("tcp://", "zmq://"), self.response)
        assert peer is not None, "no data socket"
        peer.settimeout(WAIT_S)
        self.data = peer
        self._pipeline, self._plan = pipeline, plan

    def request(self, step: int) -> list[bytes]:
        """The frames, without the token, of the request (of id `step`) for batch `step`, its
        reply asked for on the data socket."""
        asked = batch_request(self._pipeline, self.response.fingerprint, self._plan, StepWork(step))
        asked.data_socket = True
        return zmq_frames.request_frames(step, asked)

    def send(self, frames: list[bytes]) -> None:
        self.data.sendall(zmq_data.message(frames))

    def batch(self) -> tuple[int, Any]:
        """The request id and the batch of the next reply on the data socket."""
        request_id, length = zmq_data.parse_reply_head(self._exactly(zmq_data.REPLY_HEAD.size))
        header = wire.BatchResponse.FromString(self._exactly(length))
        return request_id, decode_frames([self._exactly(header.payload_size)])

    def refusal(self) -> WorkerError:
        """The worker's error in the next reply on the DEALER."""
        with pytest.raises(WorkerError) as refused:
            zmq_frames.parse_batch_reply(self.dealer.recv_multipart())
        return refused.value

    def close(self) -> None:
        self.data.close()
        self.dealer.close()
        self._context.term()

    def _exactly(self, size: int) -> bytes:
        received = b""
        while len(received) < size:
            more = self.data.recv(size - len(received))
            assert more, "the worker closed the data socket"
            received += more
        return received


@pytest.fixture
def raw(worker: Worker) -> Iterator[tuple[str, RawClient]]:
    """A worker's endpoint ("zmq://"), with a token, and a `RawClient` of it."""
    server = ZmqServer(worker, "tcp://127.0.0.1:0", token=TOKEN)
    endpoint = server.start()
    client = RawClient(endpoint, "numbers", PLAN)
    try:
        yield endpoint.replace("tcp://", "zmq://"), client
    finally:
        client.close()
        server.stop(grace=WAIT_S)


def test_a_worker_takes_batch_requests_on_the_data_socket_without_the_token(
    raw: tuple[str, RawClient], taken: list[tuple[bool, bytes]]
) -> None:
    _, client = raw
    assert client.response.data_requests
    for step in (4, 1):
        client.send(client.request(step))
    replies = dict(client.batch() for _ in range(2))
    assert_batches_equal([replies[4], replies[1]], [NUMBERS.load(PLAN, 4), NUMBERS.load(PLAN, 1)])
    assert [on_data for on_data, method in taken if method == LOAD_BATCH] == [True] * 2


def test_on_the_data_socket_a_worker_refuses_what_is_not_a_batch_request_or_a_cancel(
    raw: tuple[str, RawClient],
) -> None:
    _, client = raw
    client.send(zmq_frames.request_frames(7, handshake_request()))
    refused = client.refusal()
    assert refused.code == "INVALID_ARGUMENT"
    assert "only batch requests and cancels come on a data socket, got a HandshakeRequest" in str(
        refused
    )
    client.send(client.request(2))  # served on
    assert client.batch()[0] == 2


def test_on_the_data_socket_a_worker_refuses_a_pipeline_its_connection_shook_no_hands_for() -> None:
    """The token is not on the data socket: a request there may ask only for a pipeline that its
    connection shook hands for, with the token (whoever takes a socket over gets no other)."""
    worker = Worker({"numbers": NUMBERS, "others": NUMBERS})
    server = ZmqServer(worker, "tcp://127.0.0.1:0", token=TOKEN)
    client = RawClient(server.start(), "numbers", PLAN)
    try:
        others = client.request(3)
        others[2] = batch_request(
            "others", client.response.fingerprint, PLAN, StepWork(3)
        ).SerializeToString()
        client.send(others)
        refused = client.refusal()
        assert refused.code == "UNAUTHENTICATED"
        assert "asks only for a pipeline its connection shook hands for" in str(refused)
        assert "'others'" in str(refused)
        client.send(client.request(3))  # its own pipeline, served on
        assert client.batch()[0] == 3
    finally:
        client.close()
        server.stop(grace=WAIT_S)
        worker.close()


def test_a_worker_closes_a_data_socket_whose_bytes_do_not_frame_a_message_and_serves_on(
    raw: tuple[str, RawClient], caplog: pytest.LogCaptureFixture
) -> None:
    endpoint, client = raw
    frames = zmq_data.message(client.request(3))
    # The head says the body holds one frame more than it does.
    broken = zmq_data.MESSAGE_HEAD.pack(len(frames) - zmq_data.MESSAGE_HEAD.size + 4)
    broken += frames[zmq_data.MESSAGE_HEAD.size :] + zmq_data.FRAME_HEAD.pack(9)
    with caplog.at_level(logging.WARNING, logger="loadax.server.zmq_data"):
        client.data.sendall(broken)
        assert client.data.recv(1) == b"", "the worker left the data socket open"
    assert "declares a frame of 9 bytes, past its end" in caplog.text
    with OpenedZmq(endpoint, shared_memory=False, security=ClientSecurity(token=TOKEN)) as other:
        other.handshake(handshake_request(), WAIT_S)
        assert other.info(wire.InfoRequest(), WAIT_S).pipelines


def test_a_cancel_on_the_data_socket_lets_go_of_the_request_at_once() -> None:
    gate = Gate()
    plan = loadax.Plan(8, batch_size=1)
    pipeline = loadax.Pipeline(loadax.RangeDataset(0, 8).map(gate.record), loadax.Batcher())
    worker = Worker({"gated": pipeline}, threads=1)
    server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=1, token=TOKEN)
    client = RawClient(server.start(), "gated", plan)
    try:
        gate.armed = True
        client.send(client.request(1))
        assert gate.loading.acquire(timeout=WAIT_S), "the batch never started loading"
        client.send(client.request(2))  # waits for the handler
        wait_until(lambda: server.ledger.in_flight == 2, "both requests held")
        client.send(zmq_frames.cancel_frames(2))
        wait_until(lambda: server.ledger.in_flight == 1, "the cancelled one let go of")
        gate.opened.set()
        assert client.batch()[0] == 1
    finally:
        gate.opened.set()
        client.close()
        server.stop(grace=WAIT_S)
        worker.close()


def test_a_client_sends_batch_requests_and_cancels_on_the_data_socket(
    worker: Worker, taken: list[tuple[bool, bytes]]
) -> None:
    server = ZmqServer(worker, "tcp://127.0.0.1:0", token=TOKEN)
    endpoint = server.start()
    try:
        _, batches = load(endpoint, [3, 0, 7], security=ClientSecurity(token=TOKEN))
        with OpenedZmq(
            endpoint.replace("tcp://", "zmq://"),
            shared_memory=False,
            security=ClientSecurity(token=TOKEN),
        ) as transport:
            transport.handshake(handshake_request(), WAIT_S)
            asked = wire.BatchRequest(pipeline="numbers", step=1)
            transport.send(asked).cancel()
    finally:
        server.stop(grace=WAIT_S)
    assert_batches_equal(batches, expected([3, 0, 7]))
    batch_requests = [on_data for on_data, method in taken if method == LOAD_BATCH]
    assert batch_requests == [True] * 4
    assert (True, zmq_frames.CANCEL) in taken


def test_to_a_worker_that_takes_no_requests_on_its_data_socket_they_go_on_zeromq(
    worker: Worker,
    monkeypatch: pytest.MonkeyPatch,
    taken: list[tuple[bool, bytes]],
    sent_on_data_sockets: list[int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As to a worker older than requests on the data socket, which closes one that sends
    bytes: replies still come on the data socket."""
    monkeypatch.setattr(zmq_server, "DataPort", lambda host, port, _: DataPort(host, port))
    server = ZmqServer(worker, "tcp://127.0.0.1:0")
    try:
        with caplog.at_level(logging.WARNING, logger="loadax.server.zmq_data"):
            response, batches = load(server.start(), [5, 2])
    finally:
        server.stop(grace=WAIT_S)
    assert not response.data_requests
    assert response.data_port
    assert_batches_equal(batches, expected([5, 2]))
    assert [on_data for on_data, method in taken if method == LOAD_BATCH] == [False] * 2
    assert len(sent_on_data_sockets) == 2
    assert "closed the data socket" not in caplog.text


def test_a_request_cut_short_on_a_frozen_workers_data_socket_fails_what_waits_on_it(
    tmp_path: Path,
) -> None:
    """Requests sent to a worker frozen by SIGSTOP fill its data socket until one is taken only
    in part, which breaks the socket's framing: the client shuts it down, and every request
    waiting for a reply on it fails at once, UNAVAILABLE, to be asked elsewhere."""
    with worker_process(tmp_path, SERVED, grpc=False, zmq=True) as process:
        assert process.zmq is not None
        with OpenedZmq(process.zmq, shared_memory=False) as transport:
            response = transport.handshake(handshake_request(), WAIT_S)
            os.kill(process.process.pid, signal.SIGSTOP)
            try:
                # 1 MB each (a row position of 0 is a byte): 24 outgrow both sockets' buffers.
                replies = [
                    transport.send(
                        wire.BatchRequest(
                            pipeline="numbers",
                            fingerprint=response.fingerprint,
                            plan=handshake_request().plan,
                            step=step,
                            rows=[0] * 1_000_000,
                        )
                    )
                    for step in range(24)
                ]
                waiting = wait(replies, WAIT_S).not_done
            finally:
                os.kill(process.process.pid, signal.SIGCONT)
    assert not waiting, "requests still wait on a data socket cut short"
    errors = [reply.exception() for reply in replies]
    for error in errors:
        assert isinstance(error, WorkerError), error
        assert error.code == "UNAVAILABLE", error
    # Those sent after it, on the DEALER, fail once its queue is full (a frozen worker's).
    cut_short = "its data socket: a request sent on it was cut short"
    assert any(cut_short in str(error) for error in errors), errors
