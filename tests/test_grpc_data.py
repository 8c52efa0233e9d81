"""The data socket of the gRPC transport (`loadax.wire.zmq_data`): batch replies on a plain TCP
connection beside the worker's gRPC port, received straight into the client's buffer, while
requests, errors and heartbeats stay on gRPC."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import proxy_pipelines
import pytest
from helpers import assert_batches_equal
from processes import free_port
from test_security import make_pki
from test_zmq_data import (
    BLOBS,
    NUMBERS,
    PLAN,
    TOKEN,
    WAIT_S,
    WaitsForDataSocket,
    count_sends,
    expected,
    handshake_request,
    killed_while_streaming,
    refuses_what_misbehaves,
)
from verifying import Verifying
from workers import worker_process

import loadax
from loadax.client.security import ClientSecurity
from loadax.client.transports import zmq_data as zmq_data_client
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq_data import open_data_socket
from loadax.plan.work import StepWork
from loadax.server.config import load_config
from loadax.server.config_checks import ConfigError
from loadax.server.config_security import TlsConfig
from loadax.server.grpc_data import GrpcDataPort
from loadax.server.grpc_server import GrpcServer
from loadax.server.worker import Worker
from loadax.wire import plans, zmq_data
from loadax.wire.payloads import (
    DATA_SOCKET_FROM_BYTES,
    HEARTBEAT,
    HEARTBEAT_METADATA,
    STREAM_BATCH,
)
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    worker = Worker({"numbers": NUMBERS})
    yield worker
    worker.close()


@pytest.fixture
def sent_on_data_sockets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids (`BatchRequest.data_id`) of the replies that gRPC servers send on data sockets."""
    return count_sends(monkeypatch, GrpcDataPort, lambda request, batch: request.data_id)


def server(worker: Worker, address: str = "127.0.0.1:0", **options: Any) -> GrpcServer:
    return GrpcServer(worker, address, threads=2, max_in_flight_per_client=16, **options)


def batch_request(fingerprint: str, step: int, rows: list[int] | None = None) -> wire.BatchRequest:
    return wire.BatchRequest(
        pipeline="numbers", fingerprint=fingerprint, plan=plan_to_wire(PLAN), step=step, rows=rows
    )


class OpenedGrpc(WaitsForDataSocket, GrpcTransport):
    pass


def transport_to(address: str, **options: Any) -> GrpcTransport:
    """A transport to the worker at `address` as from another host (no shared memory), that
    asks for every batch on the data socket (`NUMBERS`' are smaller than the default's bound),
    unless `options` say otherwise."""
    options = {"shared_memory": False, "data_socket_from_bytes": 0, **options}
    return OpenedGrpc(f"grpc://{address}", **options)


def load(
    address: str, steps: list[int], **options: Any
) -> tuple[wire.HandshakeResponse, list[Any]]:
    """The handshake with the worker at `address` (`transport_to(address, **options)`), and the
    batches of `steps` (the last one's rows 1 and 3 only), verified."""
    with contextlib.closing(transport_to(address, **options)) as transport:
        target = Verifying(transport)
        response = target.handshake(handshake_request(), WAIT_S)
        requests = [
            batch_request(response.fingerprint, step, [1, 3] if index == len(steps) - 1 else None)
            for index, step in enumerate(steps)
        ]
        replies = [transport.send(request) for request in requests]
        return response, [
            target.verify(*each, WAIT_S) for each in zip(requests, replies, strict=True)
        ]


def test_batches_over_the_data_socket_are_the_local_loaders(
    worker: Worker, sent_on_data_sockets: list[int]
) -> None:
    served = server(worker, token=TOKEN)
    steps = [0, 5, 12, 24, 25]  # 24: the short last batch of the second epoch
    try:
        response, batches = load(served.start(), steps, security=ClientSecurity(token=TOKEN))
    finally:
        served.stop(grace=WAIT_S)
    assert response.data_port == served.data_port != 0
    assert len(response.data_nonce) == zmq_data.NONCE_BYTES
    assert sorted(sent_on_data_sockets) == list(range(1, len(steps) + 1))
    assert_batches_equal(batches, expected(steps))


def test_a_handshake_returns_once_the_data_socket_it_offers_is_open(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As over ZeroMQ (`test_zmq_data`): a plain transport waits for it a few times its
    handshake's time (long here, so that a loaded machine does not decide)."""
    monkeypatch.setattr(zmq_data_client, "FIRST_WAIT_S", WAIT_S)
    monkeypatch.setattr(zmq_data_client, "FIRST_WAIT_ROUND_TRIPS", 1e9)
    served = server(worker)
    try:
        address = f"grpc://{served.start()}"
        with contextlib.closing(GrpcTransport(address, shared_memory=False)) as transport:
            transport.handshake(handshake_request(), WAIT_S)
            assert transport.data_socket_open(0.0)
    finally:
        served.stop(grace=WAIT_S)


def opened_handshake(target: Verifying[GrpcTransport], client: GrpcTransport) -> str:
    """The fingerprint of a handshake after which `client`'s data socket is open: shaken again
    while the one offered could not be opened in time (on a loaded machine, within the client's
    2 s), for up to `WAIT_S`; the first batch is asked for there only once it is open."""
    deadline = time.monotonic() + WAIT_S
    while True:
        fingerprint: str = target.handshake(handshake_request(), WAIT_S).fingerprint
        if client.data_socket_open(WAIT_S) or time.monotonic() > deadline:
            return fingerprint


def test_small_batches_come_on_their_calls_after_the_first(
    worker: Worker, sent_on_data_sockets: list[int]
) -> None:
    """A reply on the data socket costs more than one on its call below
    `DATA_SOCKET_FROM_BYTES`: the first batch of a pipeline (its size unknown) goes there, the
    next ones, as small, on their calls; a bound below their size sends them all there."""
    served = server(worker)
    address = served.start()
    steps = [0, 5, 12]
    loaded = []
    try:
        for bound in (DATA_SOCKET_FROM_BYTES, 1):
            with contextlib.closing(transport_to(address, data_socket_from_bytes=bound)) as client:
                target = Verifying(client)
                fingerprint = opened_handshake(target, client)
                requests = [batch_request(fingerprint, step) for step in steps]
                loaded.append([target.load(request, WAIT_S) for request in requests])
    finally:
        served.stop(grace=WAIT_S)
    assert sent_on_data_sockets == [1, 1, 2, 3]
    for batches in loaded:
        assert_batches_equal(batches, [NUMBERS.load(PLAN, step) for step in steps])


@pytest.mark.parametrize("off", ["worker", "client", "tls"])
def test_without_a_data_socket_replies_come_over_grpc(
    worker: Worker, sent_on_data_sockets: list[int], tmp_path: Path, off: str
) -> None:
    """A worker without a data port (as one from before it), a client that does not ask (as
    one from before it), and TLS, whose protection covers the gRPC connection only."""
    options: dict[str, Any] = {"data_socket": off != "client"}
    tls = None
    if off == "tls":
        pki = make_pki(tmp_path)
        tls = TlsConfig(pki.server_cert.read_bytes(), pki.server_key.read_bytes())
        options["security"] = ClientSecurity(ca_cert=pki.ca)
    served = server(worker, data_port=None if off == "worker" else 0, tls=tls)
    try:
        response, batches = load(served.start(), [3, 7], **options)
    finally:
        served.stop(grace=WAIT_S)
    assert response.data_port == 0
    assert sent_on_data_sockets == []
    assert_batches_equal(batches, expected([3, 7]))


def test_a_data_port_that_cannot_be_reached_leaves_replies_on_grpc(
    caplog: pytest.LogCaptureFixture,
) -> None:
    offered = wire.HandshakeResponse(data_port=free_port(), data_nonce=bytes(16))
    with caplog.at_level(logging.INFO):
        assert open_data_socket("grpc://127.0.0.1:1", offered) is None
    assert "batch replies come over gRPC" in caplog.text


def test_the_worker_closes_data_sockets_that_misbehave_and_serves_on(
    worker: Worker, sent_on_data_sockets: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    served = server(worker, token=TOKEN)
    address = served.start()
    port = served.data_port
    assert port is not None

    def nonce() -> bytes:
        request = handshake_request()
        request.data_socket, request.data_key = True, os.urandom(zmq_data.KEY_BYTES)
        with grpc.insecure_channel(address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            metadata = (("authorization", f"Bearer {TOKEN}"),)
            response = stub.Handshake(request, timeout=WAIT_S, metadata=metadata)
        return bytes(response.data_nonce)

    try:
        refuses_what_misbehaves(port, nonce, caplog)
        _, batches = load(address, [2, 9], security=ClientSecurity(token=TOKEN))
    finally:
        served.stop(grace=WAIT_S)
    assert len(sent_on_data_sockets) == 2
    assert_batches_equal(batches, expected([2, 9]))


def test_a_slow_batch_for_the_data_socket_is_heartbeats_then_no_message_on_its_call() -> None:
    """Heartbeats still show a slow batch is being made; its reply comes on the data socket,
    with the id its request named, and its call ends with no message after them."""
    slow = loadax.Plan(8, batch_size=4)
    worker = Worker({"slow": proxy_pipelines.slow_after(8, delay=0.2)}, threads=2)
    served = server(worker)
    address = served.start()
    key = os.urandom(zmq_data.KEY_BYTES)
    try:
        with grpc.insecure_channel(address) as channel:
            hello = wire.HandshakeRequest(
                library_version=loadax.__version__,
                pipeline="slow",
                plan=plan_to_wire(slow),
                data_socket=True,
                data_key=key,
            )
            response = worker_pb2_grpc.WorkerStub(channel).Handshake(hello, timeout=WAIT_S)
            peer = open_data_socket(f"grpc://{address}", response)
            assert peer is not None
            request = plans.batch_request("slow", response.fingerprint, slow, StepWork(1))
            request.data_socket, request.data_key, request.data_id = True, key, 7
            call = channel.unary_stream(
                STREAM_BATCH, request_serializer=wire.BatchRequest.SerializeToString
            )
            messages = list(call(request, timeout=WAIT_S, metadata=((HEARTBEAT_METADATA, "100"),)))
            with peer:
                peer.settimeout(WAIT_S)
                head = peer.recv(zmq_data.REPLY_HEAD.size, socket.MSG_WAITALL)
    finally:
        served.stop(grace=WAIT_S)
        worker.close()
    assert len(messages) >= 3, messages  # at once, then every 0.1 s for 0.4 s
    assert set(messages) == {HEARTBEAT}, messages
    assert zmq_data.parse_reply_head(head)[0] == 7


def test_a_worker_killed_mid_stream_fails_what_it_held_at_once(tmp_path: Path) -> None:
    with (
        worker_process(tmp_path, BLOBS) as process,
        contextlib.closing(OpenedGrpc(process.grpc, shared_memory=False)) as transport,
    ):
        killed_while_streaming(process, transport)


def test_a_worker_back_at_its_address_gets_a_new_data_socket(
    worker: Worker, sent_on_data_sockets: list[int]
) -> None:
    address = f"127.0.0.1:{free_port()}"
    first = server(worker, address)
    first.start()
    with contextlib.closing(transport_to(address)) as client:
        target = Verifying(client)
        fingerprint = target.handshake(handshake_request(), WAIT_S).fingerprint
        batches = [target.load(batch_request(fingerprint, 1), WAIT_S)]
        first.stop(grace=WAIT_S)
        second = server(worker, address)
        second.start()
        try:
            client.info(wire.InfoRequest(), WAIT_S)  # connected again
            # Until the new handshake is answered, replies come over gRPC.
            while len(sent_on_data_sockets) < 2 and len(batches) < 100:
                batches.append(target.load(batch_request(fingerprint, 2), WAIT_S))
        finally:
            second.stop(grace=WAIT_S)
    # The first worker's data socket sent the first batch; the second's sent the later ones
    # (one more than the loop waited for when its client read a reply before its worker counted it).
    assert len(sent_on_data_sockets) in (2, 3), sent_on_data_sockets
    assert_batches_equal(
        batches, [NUMBERS.load(PLAN, 1)] + [NUMBERS.load(PLAN, 2)] * (len(batches) - 1)
    )


def test_the_config_sets_the_grpc_data_port_or_turns_it_off(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"

    def config(line: str) -> Path:
        path.write_text(f'[server]\ngrpc = "127.0.0.1:0"\n{line}\n{SERVED}')
        return path

    ports = [load_config(config(line)).grpc_data_port for line in PORT_LINES]
    assert ports == list(PORT_LINES.values())
    with pytest.raises(ConfigError, match=r"\[server\].grpc_data_port must be a port"):
        load_config(config("grpc_data_port = true"))


SERVED = '[pipelines.numbers]\nfactory = "pipelines:numbers"\n'
PORT_LINES = {"": 0, "grpc_data_port = 7002": 7002, "grpc_data_port = false": None}
