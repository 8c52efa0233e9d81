"""Heartbeats on a streamed batch call (loadax/wire/payloads.py): a worker sends them to a client
that asks, until the header; a client that does not ask gets none; a bad interval is refused; a
client fails a silent stream, but not one of a worker without heartbeats once a reply showed it.
Real gRPC servers on loopback."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pipelines
import proxy_pipelines
import pytest
from verifying import Verifying

import loadax
from loadax.client.transports.grpc import STREAM_FROM_S, GrpcTransport
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server.grpc_server import GrpcServer
from loadax.server.worker import Worker
from loadax.wire.codec import encode_frames
from loadax.wire.limits import GRPC_SILENCE_MS
from loadax.wire.payloads import (
    HEARTBEAT,
    HEARTBEAT_METADATA,
    PAYLOAD_SERVICE,
    STREAM_BATCH,
    EncodedBatch,
    payload_reply,
    stream_messages,
)
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 30.0
PLAN = loadax.Plan(8, batch_size=4)
NUMBERS = loadax.Plan(20, batch_size=4)
SILENCE_S = GRPC_SILENCE_MS / 1000


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[str, wire.BatchRequest]]:
    """A worker whose batch 1 takes 0.8 s (4 records of 0.4 s, 2 read at once), each time it
    is asked (it keeps no replies), and a request for it."""
    pipelines = {"slow": proxy_pipelines.slow_after(8, delay=0.4)}
    worker = Worker(pipelines, threads=2, share_cache_bytes=0)
    server = GrpcServer(worker, "127.0.0.1:0", threads=2, max_in_flight_per_client=4)
    address = server.start()
    hello = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline="slow", plan=plan_to_wire(PLAN)
    )
    try:
        with grpc.insecure_channel(address) as channel:
            handshake = channel.unary_unary(
                f"/{wire.DESCRIPTOR.services_by_name['Worker'].full_name}/Handshake",
                request_serializer=wire.HandshakeRequest.SerializeToString,
                response_deserializer=wire.HandshakeResponse.FromString,
            )
            fingerprint = handshake(hello, timeout=WAIT_S).fingerprint
        yield address, batch_request("slow", fingerprint, PLAN, StepWork(1))
    finally:
        server.stop(grace=0)
        worker.close()


def streamed(address: str, request: wire.BatchRequest, *metadata: tuple[str, str]) -> list[bytes]:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream(
            STREAM_BATCH, request_serializer=wire.BatchRequest.SerializeToString
        )
        return list(call(request, timeout=WAIT_S, metadata=metadata))


def test_a_client_that_asks_gets_heartbeats_until_the_header_and_one_that_does_not_none(
    slow: tuple[str, wire.BatchRequest],
) -> None:
    address, request = slow
    beating = streamed(address, request, (HEARTBEAT_METADATA, "100"))
    beats = beating.index(next(message for message in beating if message != HEARTBEAT))
    assert beats >= 3, beating  # at once, then every 0.1 s for 0.8 s
    plain = streamed(address, request)
    # The same header (but the worker's load, which changes: `loadax.wire.load`) and payload,
    # without heartbeats.
    assert without_load(plain) == without_load(beating[beats:])
    assert wire.BatchResponse.FromString(plain[0]).step == 1


def without_load(messages: list[bytes]) -> list[bytes]:
    """A streamed reply's messages, its header without the worker's load."""
    header = wire.BatchResponse.FromString(messages[0])
    header.ClearField("load")
    return [header.SerializeToString(), *messages[1:]]


@pytest.mark.parametrize("interval", ["0", "soon", "600000"])
def test_a_heartbeat_interval_out_of_range_is_refused_naming_it(
    slow: tuple[str, wire.BatchRequest], interval: str
) -> None:
    address, request = slow
    with pytest.raises(grpc.RpcError) as refused:
        streamed(address, request, (HEARTBEAT_METADATA, interval))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{HEARTBEAT_METADATA} must be a whole number of milliseconds" in refused.value.details()


@contextlib.contextmanager
def without_heartbeats(
    pause_s: dict[int, float], called: list[str] | None = None, stream_from_bytes: int = 0
) -> Iterator[Verifying[GrpcTransport]]:
    """A worker from before heartbeats, as a client sees it: it answers step `s` of "numbers"
    after `pause_s[s]` seconds, with no message before the header, the methods called noted in
    `called`; a transport to it."""
    pipeline = pipelines.numbers(NUMBERS.num_records)

    def batch(body: bytes, method: str) -> EncodedBatch:
        request = wire.BatchRequest.FromString(body)
        (called if called is not None else []).append(method)
        time.sleep(pause_s[request.step])
        frames = encode_frames(pipeline.load(NUMBERS, request.step))
        return EncodedBatch.answering(request, "f" * 64, frames)

    def stream(body: bytes, context: Any) -> Iterator[bytes]:
        yield from stream_messages(batch(body, "StreamBatch"))

    def unary(body: bytes, context: Any) -> bytes:
        made = batch(body, "LoadBatch")
        return payload_reply(made.header, made.frames)

    handler = grpc.method_handlers_generic_handler(
        PAYLOAD_SERVICE,
        {
            "StreamBatch": grpc.unary_stream_rpc_method_handler(stream),
            "LoadBatch": grpc.unary_unary_rpc_method_handler(unary),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    target = Verifying(
        GrpcTransport(f"grpc://127.0.0.1:{port}", stream_from_bytes=stream_from_bytes)
    )
    try:
        yield target
    finally:
        target.transport.close()
        server.stop(grace=None)


def test_a_silent_stream_fails_unless_its_worker_showed_it_sends_no_heartbeats() -> None:
    slow_s = SILENCE_S + 0.5
    with without_heartbeats({0: slow_s}) as target:
        # Nothing in 2 s: frozen, or too old to send heartbeats; it cannot tell which yet.
        with pytest.raises(WorkerError) as silent:
            target.load(batch_request("numbers", "f" * 64, NUMBERS, StepWork(0)), WAIT_S)
        assert silent.value.code == "UNAVAILABLE", silent.value
        assert "sent nothing for 2 s, not even a heartbeat" in silent.value.message
    with without_heartbeats({0: 0.0, 1: slow_s}) as target:
        target.load(batch_request("numbers", "f" * 64, NUMBERS, StepWork(0)), WAIT_S)
        # That reply came without a heartbeat: this worker's silence is no longer timed.
        assert target.load(batch_request("numbers", "f" * 64, NUMBERS, StepWork(1)), WAIT_S)


def test_a_batch_that_took_long_is_streamed_next_time_whatever_its_size() -> None:
    called: list[str] = []
    pauses = {0: 0.0, 1: 0.0, 2: STREAM_FROM_S + 0.1, 3: 0.0, 4: 0.0}
    with without_heartbeats(pauses, called, stream_from_bytes=1 << 20) as target:
        for step in range(5):
            target.load(batch_request("numbers", "f" * 64, NUMBERS, StepWork(step)), WAIT_S)
    # The first batch is streamed; small and quick, the next comes in one reply, until one
    # takes long: the one after it is streamed, with heartbeats from a worker that sends them.
    assert called == ["StreamBatch", "LoadBatch", "LoadBatch", "StreamBatch", "LoadBatch"]
