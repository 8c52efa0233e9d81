"""Through a default-configured gRPC proxy (tests/grpc_proxy.py: grpcio's defaults, so a ping
more often than every 5 minutes without data is a strike, and a third strike gets GOAWAY
`too_many_pings`), a batch that takes seconds to make arrives whole: no GOAWAY, no call lost.
Real worker and proxy processes.

A frozen worker is still found within seconds on a direct connection, by its heartbeats in place
of keepalive pings: tests/test_failure_detection.py (a frozen worker is left within seconds; its
calls fail UNAVAILABLE within seconds, and it serves once resumed).

Behind a proxy (gRPC's) or a TCP relay (ZeroMQ's: a published port, an L4 proxy), the client dials
the data port a worker offers on the proxy's host: whatever answers there, late or never, delays
no batch and learns no token."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import grpc_proxy
import proxy_pipelines
import pytest
from helpers import assert_batches_equal
from test_zmq_data import (
    NUMBERS,
    PLAN,
    TOKEN,
    WAIT_S,
    handshake_request,
    sent_on_data_sockets,  # noqa: F401 (a fixture)
)
from verifying import Verifying
from workers import worker_process

import loadax
from loadax import DataLoader
from loadax.client import RemoteDataLoader
from loadax.client.security import ClientSecurity
from loadax.client.transports.zmq import ZmqTransport
from loadax.client.transports.zmq_data import CONNECT_TIMEOUT_S
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_data
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

RECORDS, BATCH, DELAY = 8, 4, 3.0
SLOW = f"""
[pipelines.slow]
factory = "proxy_pipelines:slow_after"
args = {{ records = {RECORDS}, delay = {DELAY} }}
"""
"""A fast batch, then one of 6 s (4 records of 3 s, 2 read at once). A client pinging every
second with no data meanwhile had its connection closed by the proxy about 4 s into the wait."""


def test_a_slow_batch_crosses_a_default_proxy_without_goaway_or_loss(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pipeline = proxy_pipelines.slow_after(RECORDS, delay=0)
    local = DataLoader(pipeline.batcher).batch_size(BATCH).workers(0).build(pipeline.dataset)
    with (
        worker_process(tmp_path, SLOW) as worker,
        grpc_proxy.start(worker.grpc_address) as (proxy, log),
    ):
        target = f"grpc://{proxy}"
        with RemoteDataLoader([target], pipeline="slow").batch_size(BATCH).build() as loader:
            batches = [batch["x"].tolist() for batch in loader]
            stats = loader.stats().workers[target]
        proxied = log()
    assert "too_many_pings" not in capfd.readouterr().err  # gRPC logs a GOAWAY it receives
    assert '"event": "call"' not in proxied, proxied  # no call failed or was cancelled
    assert (stats.requests, stats.failures) == (RECORDS // BATCH, 0), stats
    assert batches == [batch["x"].tolist() for batch in local]


FAST = """
[pipelines.fast]
factory = "proxy_pipelines:slow_after"
args = { records = 16, delay = 0 }
"""


def test_behind_a_proxy_the_data_port_is_neither_waited_for_nor_trusted(
    tmp_path: pathlib.Path,
) -> None:
    """A worker (on 127.0.0.2, its own host) behind a proxy (on 127.0.0.1) offers its data port,
    which the client dials on the proxy's host: there, nothing (refused at once), then another
    program's socket that takes the connection and never answers (as a port a firewall drops
    would). Replies come over gRPC, the batches as soon as without a data port (the data socket
    is given up after `CONNECT_TIMEOUT_S`, in the background), and they are the local loader's."""
    records, batch = 16, 4
    pipeline = proxy_pipelines.slow_after(records, delay=0)
    local = DataLoader(pipeline.batcher).batch_size(batch).workers(0).build(pipeline.dataset)
    expected = [batch["x"].tolist() for batch in local]
    config = tmp_path / "worker.toml"
    config.write_text(f'[server]\ngrpc = "127.0.0.2:0"\nthreads = 2\n{FAST}')
    with (
        worker_process(tmp_path, config=config) as worker,
        grpc_proxy.start(worker.grpc_address) as (proxy, log),
    ):
        offered = _data_port(worker.grpc_address)
        target = f"grpc://{proxy}"
        for peer in (None, ("127.0.0.1", offered)):  # the same port on the proxy's host
            with contextlib.ExitStack() as stack:
                if peer is not None:
                    stack.enter_context(socket.create_server(peer))
                started = time.monotonic()
                remote = RemoteDataLoader([target], pipeline="fast").batch_size(batch)
                with remote.shared_memory(False).build() as loader:
                    batches = [batch["x"].tolist() for batch in loader]
                    loaded_s = time.monotonic() - started
                    stats = loader.stats().workers[target]
            assert (stats.requests, stats.failures) == (records // batch, 0), (peer, stats)
            assert batches == expected, peer
            assert loaded_s < CONNECT_TIMEOUT_S, (peer, loaded_s)
        proxied = log()
    assert '"event": "call"' not in proxied, proxied  # no call failed or was cancelled


def _data_port(address: str) -> int:
    """The data port that the worker at `address` offers a handshake that asks for one."""
    request = wire.HandshakeRequest(
        library_version=loadax.__version__,
        pipeline="fast",
        plan=plan_to_wire(loadax.Plan(16, batch_size=4)),
        data_socket=True,
        data_key=os.urandom(zmq_data.KEY_BYTES),
    )
    with grpc.insecure_channel(address) as channel:
        response = worker_pb2_grpc.WorkerStub(channel).Handshake(request, timeout=30)
    assert response.data_port
    return response.data_port


def test_behind_a_tcp_relay_zeromq_s_data_port_delays_no_batch_and_gets_no_token(
    sent_on_data_sockets: list[int],  # noqa: F811 (the fixture)
) -> None:
    """A ZeroMQ worker with a token (on 127.0.0.2) reached through a TCP relay (on 127.0.0.1): on
    the offered data port there, a socket that takes the connection and never answers. The
    handshake and the batches come over ZeroMQ at once, and the listener got a hello with the
    nonce and no token."""
    worker = Worker({"numbers": NUMBERS})
    server = ZmqServer(worker, "tcp://127.0.0.2:0", token=TOKEN)
    upstream = server.start().removeprefix("tcp://").rpartition(":")
    steps = [0, 5, 12]
    try:
        assert server.data_port is not None
        with (
            _tcp_relay((upstream[0], int(upstream[2]))) as relayed,
            socket.create_server(("127.0.0.1", server.data_port)) as silent,
        ):
            started = time.monotonic()
            security = ClientSecurity(token=TOKEN)
            address = f"zmq://127.0.0.1:{relayed}"
            with ZmqTransport(address, security, shared_memory=False) as transport:
                target = Verifying(transport)
                fingerprint = target.handshake(handshake_request(), WAIT_S).fingerprint
                batches = [target.load(_request(fingerprint, step), WAIT_S) for step in steps]
                loaded_s = time.monotonic() - started
                silent.settimeout(WAIT_S)
                peer, _ = silent.accept()
                with peer:
                    peer.settimeout(WAIT_S)
                    hello = peer.recv(4096)
    finally:
        server.stop(grace=WAIT_S)
        worker.close()
    assert loaded_s < CONNECT_TIMEOUT_S, loaded_s
    assert sent_on_data_sockets == []
    assert_batches_equal(batches, [NUMBERS.load(PLAN, step) for step in steps])
    assert len(hello) == zmq_data.HELLO_HEAD.size
    assert zmq_data.parse_hello_head(hello)[1] == 0  # no token follows


def _request(fingerprint: str, step: int) -> wire.BatchRequest:
    return wire.BatchRequest(
        pipeline="numbers", fingerprint=fingerprint, plan=plan_to_wire(PLAN), step=step
    )


@contextlib.contextmanager
def _tcp_relay(upstream: tuple[str, int]) -> Iterator[int]:
    """A plain TCP relay on 127.0.0.1 to `upstream` (as a published port or an L4 proxy): the
    port it listens on. Each connection it takes is copied both ways on threads of its own."""
    listener = socket.create_server(("127.0.0.1", 0))
    peers: list[socket.socket] = []

    def copy(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while data := source.recv(1 << 16):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)

    def relay() -> None:
        with contextlib.suppress(OSError):  # the listener shut
            while True:
                client = listener.accept()[0]
                server = socket.create_connection(upstream, WAIT_S)
                peers.extend((client, server))
                for ends in ((client, server), (server, client)):
                    threading.Thread(target=copy, args=ends, daemon=True).start()

    threading.Thread(target=relay, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        for each in (listener, *peers):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
            each.close()
