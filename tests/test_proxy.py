"""Through a default-configured gRPC proxy (tests/grpc_proxy.py: grpcio's defaults, so a ping
more often than every 5 minutes without data is a strike, and a third strike gets GOAWAY
`too_many_pings`), a batch that takes seconds to make arrives whole: no GOAWAY, no call lost.
Real worker and proxy processes.

A frozen worker is still found within seconds on a direct connection, by its heartbeats in place
of keepalive pings: tests/test_failure_detection.py (a frozen worker is left within seconds; its
calls fail UNAVAILABLE within seconds, and it serves once resumed)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import time

import grpc
import grpc_proxy
import proxy_pipelines
import pytest
from workers import worker_process

import loadax
from loadax import DataLoader
from loadax.client import RemoteDataLoader
from loadax.client.transports.zmq_data import CONNECT_TIMEOUT_S
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
