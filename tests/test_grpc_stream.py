"""The raw gRPC stream of a batch (loadax/wire/payloads.py): how a worker cuts a batch into
messages, and what a client makes of every stream that breaks the format, from real servers on
loopback: a gRPC server that sends exactly the messages a test gives it, and real workers.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pipelines
import pytest
from helpers import assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st
from verifying import Verifying

import loadax
from loadax.buffers import BufferPool
from loadax.client.transports.grpc import GrpcTransport
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server.grpc_server import GrpcServer
from loadax.server.worker import Worker
from loadax.wire.codec import decode_frames, encode_frames
from loadax.wire.limits import MAX_BATCH_BYTES
from loadax.wire.payloads import (
    PAYLOAD_SERVICE,
    STREAM_BATCH,
    STREAM_FROM_BYTES,
    EncodedBatch,
    payload_reply,
    read_stream,
    stream_messages,
)
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 30.0
PLAN = loadax.Plan(64, batch_size=8)
FINGERPRINT = "f" * 64


def writable(size: int) -> memoryview:
    return memoryview(bytearray(size))


# --- how a batch is cut ------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    chunk=st.integers(1, 256),
)
def test_frames_are_cut_into_segments_that_never_split_a_frame_and_join_again(
    sizes: list[int], chunk: int
) -> None:
    frames = [bytes([index]) * size for index, size in enumerate(sizes)]
    batch = EncodedBatch(1, frames)
    messages = list(stream_messages(batch, chunk))
    assert all(0 < len(message) <= chunk for message in messages[1:])
    header, segments = read_stream(messages, writable)
    assert header.payload_size == sum(sizes)
    assert b"".join(segments) == b"".join(frames)
    # Every segment boundary is a frame boundary: an array never spans two segments.
    frame_ends = set(np.cumsum(sizes).tolist())
    assert set(np.cumsum(header.segment_sizes).tolist()) <= frame_ends


def test_a_batch_of_large_and_small_arrays_decodes_from_its_segments() -> None:
    tree = {
        "image": np.arange(3 * 1000, dtype=np.float32).reshape(3, 1000),  # 12,000 bytes
        "label": np.arange(3, dtype=np.int32),
        "name": "three",
    }
    batch = EncodedBatch(1, encode_frames(tree))
    messages = list(stream_messages(batch, chunk=1000))
    header, segments = read_stream(messages, writable)
    # The image arrives in 12 messages, joined into one buffer; the padding after it and the
    # label in one.
    assert [len(message) for message in messages[1:]] == [64, *[1000] * 12, 32 + 12]
    assert list(header.segment_sizes) == [64, 12_000, 44]
    assert_batches_equal([decode_frames(segments)], [tree])


# --- streams that break the format, from a real server -------------------------------------------


@dataclasses.dataclass
class Crafted:
    """A gRPC server on loopback whose `STREAM_BATCH` sends `messages(request)` and whose
    `LOAD_BATCH_PAYLOAD` answers `reply(request)`, the methods called in `called`; and a client
    transport to it that streams every batch, with its decoder."""

    address: str
    messages: Callable[[wire.BatchRequest], Iterable[bytes]] = lambda request: ()
    reply: Callable[[wire.BatchRequest], bytes] = lambda request: b""
    called: list[str] = dataclasses.field(default_factory=list)
    ended: threading.Event = dataclasses.field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.target = Verifying(GrpcTransport(f"grpc://{self.address}", stream_from_bytes=0))

    def load(
        self, request: wire.BatchRequest, target: Verifying[GrpcTransport] | None = None
    ) -> Any:
        return (target or self.target).load(request, WAIT_S)

    def refusal(
        self, request: wire.BatchRequest, target: Verifying[GrpcTransport] | None = None
    ) -> str:
        """The message of the DATA_LOSS error that refuses the reply."""
        with pytest.raises(WorkerError) as refused:
            self.load(request, target)
        assert refused.value.code == "DATA_LOSS", refused.value
        assert refused.value.message.startswith(
            f"{self.target.name} sent a bad reply to step {request.step}: "
        ), refused.value.message
        return refused.value.message


@pytest.fixture
def crafted() -> Iterator[Crafted]:
    made: list[Crafted] = []

    def stream(body: bytes, context: Any) -> Iterator[bytes]:
        made[0].called.append("StreamBatch")
        context.add_callback(made[0].ended.set)
        yield from made[0].messages(wire.BatchRequest.FromString(body))

    def unary(body: bytes, context: Any) -> bytes:
        made[0].called.append("LoadBatch")
        return made[0].reply(wire.BatchRequest.FromString(body))

    handler = grpc.method_handlers_generic_handler(
        PAYLOAD_SERVICE,
        {
            "StreamBatch": grpc.unary_stream_rpc_method_handler(stream),
            "LoadBatch": grpc.unary_unary_rpc_method_handler(unary),
        },
    )
    # A port of its own: with SO_REUSEPORT (gRPC's default) the port picked for ":0" can be one a
    # server of an earlier test still holds, which then refuses the client's connection.
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    made.append(Crafted(f"127.0.0.1:{port}"))
    try:
        yield made[0]
    finally:
        made[0].target.close()
        server.stop(grace=None)


def request(step: int = 2) -> wire.BatchRequest:
    return batch_request("numbers", FINGERPRINT, PLAN, StepWork(step))


def answer(step: int = 2, chunk: int = 16) -> tuple[wire.BatchRequest, list[bytes], Any]:
    """A request, the messages of a true answer to it cut into `chunk` bytes, and its batch."""
    asked = request(step)
    batch = pipelines.numbers(64).load(PLAN, step)
    messages = list(
        stream_messages(EncodedBatch.answering(asked, FINGERPRINT, encode_frames(batch)), chunk)
    )
    return asked, messages, batch


def header_of(messages: list[bytes]) -> wire.BatchResponse:
    return wire.BatchResponse.FromString(messages[0])


def with_header(messages: list[bytes], change: Callable[[wire.BatchResponse], None]) -> list[bytes]:
    header = header_of(messages)
    change(header)
    return [header.SerializeToString(), *messages[1:]]


def test_a_true_stream_in_many_messages_decodes_to_the_batch(crafted: Crafted) -> None:
    asked, messages, batch = answer()
    assert len(messages) > 10
    crafted.messages = lambda request: messages
    assert_batches_equal([crafted.load(asked)], [batch])


def swapped_messages(messages: list[bytes]) -> list[bytes]:
    """Two messages of the same segment swapped: every size still holds."""
    assert list(header_of(messages).segment_sizes) == [64, 192, 32]
    return [*messages[:5], messages[6], messages[5], *messages[7:]]


BROKEN: dict[str, tuple[Callable[[list[bytes]], list[bytes]], str]] = {
    "no message": (lambda messages: [], "the stream ended before its header"),
    "no header": (lambda messages: [b"\xff" * 40, *messages[1:]], "its header is not a Batch"),
    "a header too large": (
        lambda messages: [bytes(65 << 10), *messages[1:]],
        "its header of 66560 bytes is over 65536",
    ),
    "an oversized payload": (
        lambda messages: with_header(messages, lambda h: setattr(h, "payload_size", 2**40)),
        f"its header declares {2**40} payload bytes, more than the {MAX_BATCH_BYTES}",
    ),
    "segments that do not add up": (
        lambda messages: with_header(messages, lambda h: h.segment_sizes.append(1)),
        r"its header's segments \[.*\] do not cut its \d+ payload bytes",
    ),
    "an empty segment": (
        lambda messages: with_header(messages, lambda h: h.segment_sizes.insert(0, 0)),
        r"its header's segments \[0, .*\] do not cut",
    ),
    "a truncated stream": (
        lambda messages: messages[:-2],
        r"the stream ended \d+ bytes short of segment \d+ \(\d+ bytes\)",
    ),
    "a message across two segments": (
        lambda messages: [messages[0], *messages[1:4], messages[4] + messages[5], *messages[6:]],
        r"a message of 32 bytes does not fit segment 0 \(16 of its 64 bytes left\)",
    ),
    "an empty message": (
        lambda messages: [messages[0], b"", *messages[1:]],
        r"a message of 0 bytes does not fit segment 0 \(64 of its 64 bytes left\)",
    ),
    "a message more": (
        lambda messages: [*messages, b"x"],
        r"a message of 1 bytes follows the \d+ segments its header declares",
    ),
    "messages out of order": (swapped_messages, "its payload's checksum is"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_stream_that_breaks_the_format_is_data_loss_naming_what_is_wrong(
    crafted: Crafted, broken: str
) -> None:
    change, problem = BROKEN[broken]
    asked, messages, batch = answer()
    crafted.messages = lambda request: change(messages)
    message = crafted.refusal(asked)
    assert re.search(problem, message), message
    # The call is over at the server too, and the target still reads a true stream.
    assert crafted.ended.wait(WAIT_S)
    crafted.messages = lambda request: messages
    assert_batches_equal([crafted.load(asked)], [batch])


def true_replies(crafted: Crafted) -> tuple[wire.BatchRequest, Any, int]:
    """Make `crafted` answer the truth both ways; the request, its batch and its size."""
    asked = request()
    batch = pipelines.numbers(64).load(PLAN, asked.step)
    encoded = EncodedBatch.answering(asked, FINGERPRINT, encode_frames(batch))
    crafted.messages = lambda request: stream_messages(encoded, chunk=16)
    crafted.reply = lambda request: payload_reply(encoded.header, encoded.frames)
    return asked, batch, encoded.size


@pytest.mark.parametrize("large", [False, True])
def test_a_pipelines_next_batch_is_streamed_as_its_last_ones_size_says(
    crafted: Crafted, large: bool
) -> None:
    asked, batch, size = true_replies(crafted)
    target = Verifying(
        GrpcTransport(crafted.target.name, stream_from_bytes=size if large else size + 1)
    )
    try:
        for _ in range(3):
            assert_batches_equal([crafted.load(asked, target)], [batch])
    finally:
        target.close()
    expected = ["StreamBatch"] * 3 if large else ["StreamBatch", "LoadBatch", "LoadBatch"]
    assert crafted.called == expected


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (b"\x01\x00", "a reply of 2 bytes is too short for a header"),
        (struct.pack("<I", 100) + bytes(10), "the reply declares a header of 100 bytes in 14"),
        (struct.pack("<I", 3) + b"\xff\xff\xff", "its header is not a BatchResponse"),
    ],
)
def test_a_malformed_reply_in_one_message_is_data_loss_naming_what_is_wrong(
    crafted: Crafted, reply: bytes, problem: str
) -> None:
    asked, batch, _ = true_replies(crafted)
    # Streams the first batch, then asks in one reply.
    target = Verifying(GrpcTransport(crafted.target.name))
    try:
        assert_batches_equal([crafted.load(asked, target)], [batch])
        crafted.reply = lambda request: reply
        assert problem in crafted.refusal(asked, target)
    finally:
        target.close()
    assert crafted.called == ["StreamBatch", "LoadBatch"]


def test_a_client_that_gives_up_on_a_hung_stream_ends_the_call(crafted: Crafted) -> None:
    asked, messages, batch = answer()
    started, hung = threading.Event(), threading.Event()

    def hang(request: wire.BatchRequest) -> Iterator[bytes]:
        yield from messages[:3]
        started.set()
        hung.wait(WAIT_S)  # a worker that stops sending, as a frozen one does

    crafted.messages = hang
    pending = crafted.target.transport.send(asked)
    assert started.wait(WAIT_S)
    assert pending.cancel()  # what the client does with a request to a hung worker
    assert crafted.ended.wait(WAIT_S)  # the worker's call ends with it
    hung.set()
    crafted.ended.clear()
    crafted.messages = lambda request: messages
    assert_batches_equal([crafted.load(asked)], [batch])


# --- a real worker -----------------------------------------------------------------------------

BLOB_FLOATS = 1 << 20  # a row of 4 MiB
BLOBS = loadax.Plan(16, batch_size=8)  # 32 MiB: streamed


@pytest.fixture
def blobs() -> Iterator[tuple[Worker, str]]:
    """A worker of 4 MiB rows with a memory budget, serving one call per client at once."""
    worker = Worker(
        {"blobs": pipelines.blobs(16, floats=BLOB_FLOATS)}, threads=2, memory_budget_bytes=96 << 20
    )
    server = GrpcServer(worker, "127.0.0.1:0", threads=2, max_in_flight_per_client=1)
    address = server.start()
    try:
        yield worker, address
    finally:
        server.stop(grace=0)
        worker.close()


def blob_request(target: Verifying[GrpcTransport], step: int) -> wire.BatchRequest:
    handshake = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline="blobs", plan=plan_to_wire(BLOBS)
    )
    fingerprint = target.handshake(handshake, timeout=WAIT_S).fingerprint
    return batch_request("blobs", fingerprint, BLOBS, StepWork(step))


def test_a_large_batch_is_the_local_batch_and_its_buffer_is_reused(
    blobs: tuple[Worker, str],
) -> None:
    _, address = blobs
    pool = BufferPool()
    target = Verifying(GrpcTransport(f"grpc://{address}", buffers=pool, shared_memory=False))
    local = pipelines.blobs(16, floats=BLOB_FLOATS)
    try:
        for step in range(2):
            batch = target.load(blob_request(target, step), WAIT_S)
            assert batch["x"].nbytes >= STREAM_FROM_BYTES
            assert_batches_equal([batch], [local.load(BLOBS, step)])
            del batch  # its buffer is free again: the next batch is received into it
            assert pool.kept == 1
    finally:
        target.close()


def test_a_cancelled_stream_frees_its_budget_and_its_place_at_once(
    blobs: tuple[Worker, str],
) -> None:
    worker, address = blobs
    budget = worker.memory_budget
    assert budget is not None
    target = Verifying(GrpcTransport(f"grpc://{address}"))
    requests = [blob_request(target, step) for step in range(2)]
    target.close()
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream(
            STREAM_BATCH, request_serializer=wire.BatchRequest.SerializeToString
        )
        stream = call(requests[0], timeout=WAIT_S)
        next(stream)  # the header: the batch is built, and holds its share of the budget
        assert budget.reserved > 0
        stream.cancel()
        deadline = time.monotonic() + WAIT_S
        while budget.reserved and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the worker's state; the release runs in gRPC's thread
        assert budget.reserved == 0
        # Its place among the client's one call in flight is free: the next call is served.
        header, _ = read_stream(call(requests[1], timeout=WAIT_S), writable)
        assert header.step == 1
