"""Through a default-configured gRPC proxy (tests/grpc_proxy.py: grpcio's defaults, so a ping
more often than every 5 minutes without data is a strike, and a third strike gets GOAWAY
`too_many_pings`), a batch that takes seconds to make arrives whole: no GOAWAY, no call lost.
Real worker and proxy processes.

A frozen worker is still found within seconds on a direct connection, by its heartbeats in place
of keepalive pings: tests/test_failure_detection.py (a frozen worker is left within seconds; its
calls fail UNAVAILABLE within seconds, and it serves once resumed)."""

from __future__ import annotations

import pathlib

import grpc_proxy
import proxy_pipelines
import pytest
from workers import worker_process

from loadax import DataLoader
from loadax.client import RemoteDataLoader

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
