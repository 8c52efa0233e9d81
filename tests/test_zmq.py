"""The ZeroMQ transport: framing, and a real server and client on 127.0.0.1 in this process."""

from __future__ import annotations

import logging
import socket as net
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import assert_batches_equal
from verifying import Verifying

import loadax.wire.codec
from loadax.buffers import BufferPool
from loadax.client.transports.zmq import ZmqTransport
from loadax.dataset.ops import DatasetBase
from loadax.errors import RecordError, WorkerError
from loadax.plan.permutation import IndexArray
from loadax.server.worker import Worker
from loadax.server.zmq_outbox import tracked_frames
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_frames
from loadax.wire.checksum import payload_checksum
from loadax.wire.failures import RecordFailed
from loadax.wire.messages import RequestMessage
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import plan_to_wire, request_digest
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 10.0  # the most any test waits for something that should happen at once


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


NUMBERS = loadax.Pipeline(
    loadax.RangeDataset(0, 100).map(
        lambda i: {"x": np.full(3, i, dtype=np.float32), "y": np.int64(2 * i)}
    ),
    loadax.Batcher(),
)
NUMBERS_PLAN = loadax.Plan(100, 8, seed=3, shuffle=True, num_epochs=2)


@pytest.fixture
def gated() -> Iterator[GatedDataset]:
    dataset = GatedDataset(16)
    yield dataset
    dataset.gate.set()  # before the server stops, so that no handler stays blocked


@pytest.fixture
def worker(gated: GatedDataset) -> Iterator[Worker]:
    gated.gate.set()  # the worker reads a probe batch of each pipeline at start
    worker = Worker({"numbers": NUMBERS, "slow": loadax.Pipeline(gated, loadax.Batcher())})
    gated.gate.clear()
    gated.started.clear()
    yield worker
    worker.close()


ServerFactory = Callable[..., str]
Client = Verifying[ZmqTransport]
"""A ZeroMQ transport and the decoder of its replies."""


@pytest.fixture
def serve(worker: Worker, gated: GatedDataset) -> Iterator[ServerFactory]:
    """Starts a server for the worker; returns its endpoint."""
    servers: list[ZmqServer] = []

    def start(**options: Any) -> str:
        options = {"threads": 4, "max_in_flight_per_client": 64, **options}
        server = ZmqServer(worker, "tcp://127.0.0.1:0", **options)
        servers.append(server)
        return server.start()

    yield start
    gated.gate.set()
    for server in servers:
        server.stop(grace=WAIT_S)


@pytest.fixture
def server(serve: ServerFactory) -> str:
    return serve()


@pytest.fixture
def connect() -> Iterator[Callable[[str], Client]]:
    targets: list[Client] = []

    def open_target(endpoint: str) -> Client:
        target = Verifying(ZmqTransport(endpoint.replace("tcp://", "zmq://")))
        targets.append(target)
        return target

    yield open_target
    for target in targets:
        target.close()


SocketFactory = Callable[[int], zmq.Socket[bytes]]


@pytest.fixture
def open_socket() -> Iterator[SocketFactory]:
    """Raw sockets, for messages no ZmqTransport would send and for servers that never answer."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []

    def open_one(kind: int) -> zmq.Socket[bytes]:
        socket = context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        sockets.append(socket)
        return socket

    yield open_one
    for socket in sockets:
        socket.close(linger=0)
    context.term()


@pytest.fixture
def raw(open_socket: SocketFactory, server: str) -> zmq.Socket[bytes]:
    """A DEALER socket connected to the server."""
    socket = open_socket(zmq.DEALER)
    socket.connect(server)
    return socket


def handshake(target: Client, pipeline: str = "numbers", **changes: Any) -> wire.HandshakeResponse:
    request = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(NUMBERS_PLAN)
    )
    for name, value in changes.items():
        setattr(request, name, value)
    return target.handshake(request, timeout=WAIT_S)


def batch_request(
    fingerprint: str,
    step: int,
    *,
    pipeline: str = "numbers",
    plan: loadax.Plan = NUMBERS_PLAN,
    rows: list[int] | None = None,
) -> wire.BatchRequest:
    return wire.BatchRequest(
        pipeline=pipeline, fingerprint=fingerprint, plan=plan_to_wire(plan), step=step, rows=rows
    )


def receive(socket: zmq.Socket[bytes]) -> list[bytes]:
    assert socket.poll(int(WAIT_S * 1000)), "no reply"
    return socket.recv_multipart()


def error_of(reply: list[bytes]) -> wire.ErrorReply:
    assert reply[1] == zmq_frames.ERROR, reply
    error = wire.ErrorReply()
    error.ParseFromString(reply[2])
    return error


# --- framing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        wire.HandshakeRequest(library_version="0.3.0", pipeline="p", plan=wire.Plan(seed=4)),
        wire.BatchRequest(pipeline="p", fingerprint="f", step=7, rows=[1, 5]),
        wire.InfoRequest(),
    ],
)
def test_requests_round_trip(message: RequestMessage) -> None:
    frames = zmq_frames.request_frames(2**64 - 1, message)
    assert len(frames) == 3
    assert frames[0] == b"\xff" * 8
    request = zmq_frames.parse_request([memoryview(frame) for frame in frames])
    assert request.request_id == 2**64 - 1
    assert request.message == message
    assert type(request.message) is type(message)


def test_replies_round_trip() -> None:
    response = wire.HandshakeResponse(library_version="0.3.0", pipeline="p", fingerprint="f")
    frames = zmq_frames.reply_frames(9, response)
    assert frames[:2] == [(9).to_bytes(8, "big"), b"ok"]
    reply = zmq_frames.parse_reply(frames, wire.HandshakeResponse)
    assert (reply.request_id, reply.response) == (9, response)


def test_batch_reply_sends_each_array_from_its_own_memory_and_decodes_views() -> None:
    array = np.arange(6)
    request = batch_request("f", 3)
    batch = EncodedBatch.answering(request, "f", loadax.wire.codec.encode_frames({"x": array}))
    frames = zmq_frames.reply_frames(5, batch)
    assert frames[3:] == list(batch.frames)
    assert b"".join(frames[3:]) == loadax.wire.codec.encode({"x": array})
    assert any(np.shares_memory(np.frombuffer(frame, np.uint8), array) for frame in frames[3:])
    head = wire.BatchResponse()
    head.ParseFromString(bytes(frames[2]))
    assert head.payload == b""
    assert head == batch.header
    assert head.request_digest == request_digest(request)
    assert head.checksum == payload_checksum(frames[3:])
    reply = zmq_frames.parse_batch_reply(frames)
    assert (reply.request_id, reply.header) == (5, head)
    assert all(view.readonly for view in reply.payload)
    decoded = loadax.wire.codec.decode_frames(reply.payload)["x"]
    np.testing.assert_array_equal(decoded, array)
    assert np.shares_memory(decoded, array)  # sent and received in place: no copy anywhere


def test_a_batch_reply_cuts_large_arrays_into_views_of_at_most_payload_frame_bytes() -> None:
    array = np.arange(5 * zmq_frames.PAYLOAD_FRAME_BYTES // 16, dtype=np.float64)  # 2.5 frames
    tree = {"x": array, "y": np.arange(3)}
    batch = EncodedBatch.answering(
        batch_request("f", 0), "f", loadax.wire.codec.encode_frames(tree)
    )
    payload = zmq_frames.reply_frames(1, batch)[3:]
    assert [len(frame) for frame in payload][1:4] == [zmq_frames.PAYLOAD_FRAME_BYTES] * 2 + [
        zmq_frames.PAYLOAD_FRAME_BYTES // 2
    ]
    assert all(len(frame) <= zmq_frames.PAYLOAD_FRAME_BYTES for frame in payload)
    assert all(np.shares_memory(np.frombuffer(frame, np.uint8), array) for frame in payload[1:4])
    assert b"".join(payload) == loadax.wire.codec.encode(tree)


def test_a_failed_record_travels_as_its_parts() -> None:
    failed = RecordFailed.of(RecordError(7, 2, ValueError("bad record")), "Traceback (...)")
    with pytest.raises(RecordFailed) as caught:
        zmq_frames.parse_batch_reply(zmq_frames.error_frames(1, failed))
    assert caught.value.code == "ABORTED"
    assert caught.value.record == failed.record
    rebuilt = caught.value.rebuild("zmq://worker:1")
    assert (rebuilt.index, rebuilt.epoch) == (7, 2)
    assert str(rebuilt) == "record 7 (epoch 2) failed: ValueError: bad record"


def test_error_replies_raise_the_workers_error() -> None:
    frames = zmq_frames.error_frames(1, WorkerError("NOT_FOUND", "no such pipeline"))
    with pytest.raises(WorkerError, match="no such pipeline") as caught:
        zmq_frames.parse_reply(frames, wire.InfoResponse)
    assert caught.value.code == "NOT_FOUND"
    with pytest.raises(WorkerError) as caught:
        zmq_frames.parse_batch_reply(frames)
    assert caught.value.code == "NOT_FOUND"


ID = (1).to_bytes(8, "big")


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([], "3 frames"),
        ([ID, b"Info"], "3 frames"),
        ([ID, b"Info", b"", b""], "3 frames"),
        ([b"\x01", b"Info", b""], "8 bytes, got 1"),
        ([ID, b"Nope", b""], "unknown method b'Nope'"),
        ([ID, b"LoadBatch", b"\xff\xff\xff"], "not a valid BatchRequest"),
    ],
)
def test_malformed_requests_are_invalid_arguments(frames: list[bytes], match: str) -> None:
    with pytest.raises(WorkerError, match=match) as caught:
        zmq_frames.parse_request(frames)
    assert caught.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([ID, b"ok"], "at least 3 frames"),
        ([ID, b"maybe", b""], "unknown reply status"),
        ([ID, b"ok", b"", b"extra"], "3 frames, got 4"),
        ([ID, b"error", b"\xff\xff"], "not a valid ErrorReply"),
        ([b"", b"ok", b""], "8 bytes, got 0"),
    ],
)
def test_malformed_replies_are_data_loss(frames: list[bytes], match: str) -> None:
    with pytest.raises(WorkerError, match=match) as caught:
        zmq_frames.parse_reply(frames, wire.InfoResponse)
    assert caught.value.code == "DATA_LOSS"  # the worker's fault: another worker is asked


def test_batch_reply_without_payload_frame_is_invalid() -> None:
    frames = zmq_frames.reply_frames(1, wire.BatchResponse(step=0, payload=b"x"))[:3]
    with pytest.raises(WorkerError, match="4 frames, got 3"):
        zmq_frames.parse_batch_reply(frames)


def test_request_ids_are_uint64() -> None:
    with pytest.raises(ValueError, match="uint64"):
        zmq_frames.encode_request_id(2**64)
    with pytest.raises(ValueError, match="uint64"):
        zmq_frames.encode_request_id(-1)


# --- server and client ------------------------------------------------------------------------


def test_handshake_answers_fingerprint_and_length(
    server: str, connect: Callable[[str], Client]
) -> None:
    target = connect(server)
    response = handshake(target, "numbers")
    assert (response.pipeline, response.num_records) == ("numbers", 100)
    assert response.library_version == loadax.__version__
    assert response.loading_slots == 4  # the server's threads: what it loads at once
    info = target.transport.info(wire.InfoRequest(), timeout=WAIT_S)
    assert {p.name: p.fingerprint for p in info.pipelines}["numbers"] == response.fingerprint


@pytest.mark.parametrize("rows", [None, [0], [1, 3]])
def test_batches_equal_local_loads(
    server: str, connect: Callable[[str], Client], rows: list[int] | None
) -> None:
    target = connect(server)
    fingerprint = handshake(target, "numbers").fingerprint
    steps = [0, 5, 12, 24]  # 24: the short last batch of the second epoch
    requests = [batch_request(fingerprint, s, rows=rows) for s in steps]
    replies = [target.transport.send(request) for request in requests]
    assert_batches_equal(
        [target.verify(*sent, WAIT_S) for sent in zip(requests, replies, strict=True)],
        [NUMBERS.load(NUMBERS_PLAN, step, rows) for step in steps],
    )


def test_many_concurrent_requests_resolve_to_their_steps(
    server: str, connect: Callable[[str], Client]
) -> None:
    target = connect(server)
    fingerprint = handshake(target, "numbers").fingerprint
    steps = [step % 26 for step in range(50)]
    requests = [batch_request(fingerprint, step) for step in steps]
    replies = [target.transport.send(request) for request in requests]
    assert_batches_equal(
        [target.verify(*sent, WAIT_S) for sent in zip(requests, replies, strict=True)],
        [NUMBERS.load(NUMBERS_PLAN, step) for step in steps],
    )


def test_batches_are_read_only_views_of_a_pooled_receive_buffer(server: str) -> None:
    buffers = BufferPool()
    with ZmqTransport(
        server.replace("tcp://", "zmq://"), buffers=buffers, shared_memory=False
    ) as transport:
        target = Verifying(transport)
        fingerprint = handshake(target, "numbers").fingerprint
        array = target.load(batch_request(fingerprint, 1), WAIT_S)["x"]
    assert not array.flags.writeable
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview)
    assert base.readonly
    # A view of the buffer the pool handed out, which keeps the pool's own array alive.
    assert isinstance(base.obj, np.ndarray)
    assert base.obj.base is not None
    assert np.shares_memory(array, base.obj.base)
    assert buffers.kept == 1


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"pipeline": "nope"}, "NOT_FOUND"),
        ({"fingerprint": "0" * 64}, "FAILED_PRECONDITION"),
        ({"step": 26}, "OUT_OF_RANGE"),
        ({"rows": [3, 2]}, "INVALID_ARGUMENT"),
    ],
)
def test_batch_errors_map_to_worker_error_codes(
    server: str, connect: Callable[[str], Client], changes: dict[str, Any], code: str
) -> None:
    target = connect(server)
    request = batch_request(handshake(target, "numbers").fingerprint, 0)
    for name, value in changes.items():
        if name == "rows":
            request.rows[:] = value
        else:
            setattr(request, name, value)
    error = target.transport.send(request).exception(WAIT_S)
    assert isinstance(error, WorkerError)
    assert error.code == code


@pytest.mark.parametrize(
    ("changes", "code"),
    [({"pipeline": "nope"}, "NOT_FOUND"), ({"library_version": "0.1.0"}, "FAILED_PRECONDITION")],
)
def test_handshake_errors_map_to_worker_error_codes(
    server: str, connect: Callable[[str], Client], changes: dict[str, Any], code: str
) -> None:
    target = connect(server)
    with pytest.raises(WorkerError) as caught:
        handshake(target, **changes)
    assert caught.value.code == code


@pytest.mark.parametrize(
    "frames",
    [
        [ID, b"Info"],
        [ID, b"Info", b"", b"extra"],
        [ID, b"Nope", b""],
        [ID, b"LoadBatch", b"\xff\xff\xff"],
    ],
    ids=["too-few-frames", "too-many-frames", "unknown-method", "garbage-body"],
)
def test_malformed_messages_get_invalid_argument(
    raw: zmq.Socket[bytes],
    server: str,
    connect: Callable[[str], Client],
    frames: list[bytes],
) -> None:
    raw.send_multipart(frames)
    reply = receive(raw)
    assert reply[0] == ID
    assert error_of(reply).code == "INVALID_ARGUMENT"
    assert handshake(connect(server), "numbers").num_records == 100


def test_messages_without_a_request_id_are_dropped(
    raw: zmq.Socket[bytes], server: str, connect: Callable[[str], Client]
) -> None:
    raw.send(b"")
    raw.send_multipart([b"short", b"Info", b""])
    good = zmq_frames.request_frames(7, wire.InfoRequest())
    raw.send_multipart(good)
    # Messages from one peer are handled in order: the first reply is the good request's.
    reply = receive(raw)
    assert reply[:2] == [good[0], b"ok"]
    assert handshake(connect(server), "numbers").num_records == 100


def test_oversized_messages_disconnect_only_their_sender(
    open_socket: SocketFactory, serve: ServerFactory, connect: Callable[[str], Client]
) -> None:
    endpoint = serve(max_request_bytes=1024)
    socket = open_socket(zmq.DEALER)
    socket.connect(endpoint)
    socket.send_multipart([ID, b"Info", bytes(4096)])
    assert handshake(connect(endpoint), "numbers").num_records == 100


def test_requests_beyond_the_per_client_limit_are_refused(
    serve: ServerFactory, connect: Callable[[str], Client], gated: GatedDataset
) -> None:
    endpoint = serve(max_in_flight_per_client=1)
    target = connect(endpoint)
    fingerprint = handshake(target, "slow").fingerprint
    plan = loadax.Plan(16, 4)
    asked = batch_request(fingerprint, 0, pipeline="slow", plan=plan)
    slow = target.transport.send(asked)
    assert gated.started.wait(WAIT_S)
    with pytest.raises(WorkerError) as caught:
        target.transport.info(wire.InfoRequest(), timeout=WAIT_S)
    assert caught.value.code == "RESOURCE_EXHAUSTED"
    # The limit is per client: another one is served.
    assert connect(endpoint).transport.info(wire.InfoRequest(), timeout=WAIT_S).pipelines
    gated.gate.set()
    np.testing.assert_array_equal(target.verify(asked, slow, WAIT_S), [0, 1, 2, 3])


def test_stop_finishes_requests_in_flight_and_refuses_new_ones(
    worker: Worker, connect: Callable[[str], Client], gated: GatedDataset
) -> None:
    server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=2, max_in_flight_per_client=8)
    target = connect(server.start())
    stopper = threading.Thread(target=server.stop, args=(WAIT_S,))
    try:
        fingerprint = handshake(target, "slow").fingerprint
        plan = loadax.Plan(16, 4)
        asked = batch_request(fingerprint, 2, pipeline="slow", plan=plan)
        slow = target.transport.send(asked)
        assert gated.started.wait(WAIT_S)
        stopper.start()
        # Requests are served until stop() takes effect, then refused; each waits for its reply.
        refused: WorkerError | None = None
        for _ in range(10_000):
            try:
                target.transport.info(wire.InfoRequest(), timeout=WAIT_S)
            except WorkerError as error:
                refused = error
                break
        assert refused is not None, "the server kept taking requests after stop()"
        assert refused.code == "UNAVAILABLE"
        assert stopper.is_alive()
        gated.gate.set()
        np.testing.assert_array_equal(target.verify(asked, slow, WAIT_S), [8, 9, 10, 11])
        stopper.join(WAIT_S)
        assert not stopper.is_alive()
    finally:
        gated.gate.set()
        server.stop(grace=0)  # waits for the stopper's stop() if that still runs


def test_close_fails_pending_requests_with_unavailable(
    server: str, connect: Callable[[str], Client], gated: GatedDataset
) -> None:
    target = connect(server)
    fingerprint = handshake(target, "slow").fingerprint
    request = batch_request(fingerprint, 0, pipeline="slow", plan=loadax.Plan(16, 4))
    pending = target.transport.send(request)
    assert gated.started.wait(WAIT_S)
    target.close()
    error = pending.exception(WAIT_S)
    assert isinstance(error, WorkerError)
    assert error.code == "UNAVAILABLE"
    late = target.transport.send(request).exception(WAIT_S)
    assert isinstance(late, WorkerError)
    assert late.code == "UNAVAILABLE"
    with pytest.raises(WorkerError, match="closed"):
        target.transport.info(wire.InfoRequest())


def test_a_lost_connection_fails_its_pending_requests_with_unavailable(
    worker: Worker, connect: Callable[[str], Client], gated: GatedDataset
) -> None:
    server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=2, max_in_flight_per_client=8)
    try:
        target = connect(server.start())
        fingerprint = handshake(target, "slow").fingerprint
        request = batch_request(fingerprint, 0, pipeline="slow", plan=loadax.Plan(16, 4))
        pending = target.transport.send(request)
        assert gated.started.wait(WAIT_S)
        server.stop(grace=0)  # the worker goes away with the request
        error = pending.exception(WAIT_S)
        assert isinstance(error, WorkerError)
        assert error.code == "UNAVAILABLE"
        assert "lost the connection" in error.message
    finally:
        gated.gate.set()
        server.stop(grace=0)


def test_unanswered_handshake_exceeds_its_deadline(
    open_socket: SocketFactory, connect: Callable[[str], Client]
) -> None:
    silent = open_socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    target = connect(f"tcp://127.0.0.1:{port}")
    with pytest.raises(WorkerError) as caught:
        target.handshake(wire.HandshakeRequest(pipeline="numbers"), timeout=0.2)
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert silent.poll(int(WAIT_S * 1000))  # it was sent, just never answered


def test_addresses_must_be_zmq_or_tcp() -> None:
    with pytest.raises(ValueError, match="zmq://host:port"):
        ZmqTransport("grpc://127.0.0.1:1")
    with pytest.raises(ValueError, match="invalid ZeroMQ address"):
        ZmqTransport("zmq://no port")


def test_a_client_that_keeps_misbehaving_gets_one_warning_line_per_interval(
    open_socket: SocketFactory, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loadax.server")
    clients = [open_socket(zmq.DEALER) for _ in range(2)]
    for client in clients:
        client.connect(server)
        for _ in range(200):
            client.send_multipart([b"\x01"])  # no request id to answer
            client.send_multipart([ID, b"Nope", b""])  # refused: unknown method
        # Messages of one connection are handled in order: once this is answered, all were.
        last = (2).to_bytes(8, "big")
        client.send_multipart([last, b"Info", wire.InfoRequest().SerializeToString()])
        replies = [receive(client) for _ in range(201)]  # 200 refusals, then the answer
        assert replies[-1][:2] == [last, b"ok"]
    dropped = [r for r in caplog.records if "no request id to answer" in r.getMessage()]
    refused = [r for r in caplog.records if "unknown method" in r.getMessage()]
    # One line per client and kind, however many times it happened.
    assert len(dropped) == 2, [r.getMessage() for r in dropped]
    assert len(refused) == 2, [r.getMessage() for r in refused]
    assert len({r.getMessage().split(": ")[0] for r in dropped}) == 2


def test_a_peer_that_keeps_closing_the_handshake_is_a_refusal_naming_curve() -> None:
    # What a plaintext client sees of a CURVE worker that closes first: failures without a reason.
    with net.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        stop = threading.Event()

        def close_every_connection() -> None:
            listener.settimeout(0.1)
            while not stop.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                connection.recv(64)  # the client's greeting, then hang up
                connection.close()

        closer = threading.Thread(target=close_every_connection, daemon=True)
        closer.start()
        target = ZmqTransport(f"zmq://127.0.0.1:{listener.getsockname()[1]}")
        try:
            with pytest.raises(WorkerError) as refused:
                target.info(wire.InfoRequest(), timeout=WAIT_S)
        finally:
            target.close()
            stop.set()
            closer.join()
    assert refused.value.code == "UNAUTHENTICATED", refused.value
    assert "without saying why: it most likely requires CURVE" in refused.value.message


def test_a_reply_of_small_parts_is_copied_untracked_a_payload_sent_from_its_buffer() -> None:
    header = [zmq_frames.encode_request_id(7), zmq_frames.OK, b"a header"]
    frames, tracker = tracked_frames(header)
    assert tracker is None  # nothing of the worker's is held once libzmq has a copy
    assert frames == header
    payload = memoryview(bytearray(zmq.COPY_THRESHOLD))
    frames, tracker = tracked_frames([*header, payload])
    assert tracker is not None
    assert not tracker.done
    assert frames[:3] == header
    assert isinstance(frames[3], zmq.Frame)
    payload[0] = 1  # not copied: the frame is the payload's buffer
    assert frames[3].buffer[0] == 1
