"""A worker is bounded by default: its memory budget is a share of the machine's memory (or of
its cgroup's limit), reported where an operator looks; and a batch that cannot fit a reply or the
budget is refused as the request's own fault (INVALID_ARGUMENT), before it is built when its size
can be told from the rows asked."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import failure_pipelines
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from workers import worker_process

import loadax
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server.grpc_server import GrpcServer
from loadax.server.memory import DEFAULT_SHARE, default_budget, machine_memory
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

PHYSICAL = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
REPLY_LIMIT = 64 << 10
ROW_FLOATS = 4096  # 16 KiB a row: a reply holds 3 rows
WAIT_S = 30.0


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, PHYSICAL),
        ({"memory.max": "max\n"}, PHYSICAL),
        ({"memory.max": f"{1 << 30}\n"}, min(PHYSICAL, 1 << 30)),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, PHYSICAL),
        ({"memory/memory.limit_in_bytes": f"{512 << 20}\n"}, min(PHYSICAL, 512 << 20)),
    ],
    ids=["no cgroup", "v2 unlimited", "v2 limit", "v1 unlimited", "v1 limit"],
)
def test_the_default_budget_is_a_share_of_the_memory_the_process_may_use(
    tmp_path: Path, files: dict[str, str], expected: int
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert machine_memory(tmp_path) == expected
    assert default_budget(tmp_path) == expected // DEFAULT_SHARE


def test_a_worker_that_sets_no_budget_has_the_default_one() -> None:
    worker = Worker({"numbers": failure_pipelines.ragged()}, threads=1)
    try:
        assert worker.memory_budget.limit == default_budget()
    finally:
        worker.close()


def test_a_real_worker_reports_its_default_budget_in_its_ready_line_and_metrics(
    tmp_path: Path,
) -> None:
    with worker_process(tmp_path, args=["--metrics", "127.0.0.1:0"]) as worker:
        ready = next(
            line for line in worker.output().splitlines() if line.startswith('{"event": "ready"')
        )
        assert f'"memory_budget_bytes": {default_budget()}' in ready
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{worker.metrics}/metrics", timeout=WAIT_S) as page:
            text = page.read().decode()
    gauges = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert gauges["loadax_worker_memory_budget_bytes"] == default_budget()


PLAN = loadax.Plan(64, batch_size=8)


@pytest.fixture(params=["grpc", "zmq"])
def serve(request: pytest.FixtureRequest) -> Iterator[tuple[Worker, GrpcTransport | ZmqTransport]]:
    """A worker whose replies may hold `REPLY_LIMIT` bytes, and a client of it."""
    worker = Worker(
        {
            "wide": loadax.Pipeline(
                loadax.RangeDataset(0, 64).map(failure_pipelines.Row(ROW_FLOATS)),
                loadax.Batcher(),
            ),
            "growing": failure_pipelines.growing(),
        },
        threads=2,
    )
    if request.param == "grpc":
        server: GrpcServer | ZmqServer = GrpcServer(
            worker,
            "127.0.0.1:0",
            threads=2,
            max_in_flight_per_client=4,
            max_reply_bytes=REPLY_LIMIT,
        )
        client: GrpcTransport | ZmqTransport = GrpcTransport(f"grpc://{server.start()}")
    else:
        server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=2, max_reply_bytes=REPLY_LIMIT)
        client = ZmqTransport(server.start())
    yield worker, client
    client.close()
    server.stop(0)
    worker.close()


def answer(
    client: GrpcTransport | ZmqTransport, pipeline: str, work: StepWork
) -> BaseException | None:
    fingerprint = client.handshake(
        wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(PLAN)
        )
    ).fingerprint
    return client.send(batch_request(pipeline, fingerprint, PLAN, work)).exception(WAIT_S)


def test_a_batch_larger_than_a_reply_is_refused_before_it_is_built(
    serve: tuple[Worker, GrpcTransport | ZmqTransport],
) -> None:
    worker, client = serve
    row = worker_row(worker)
    calls = row.calls
    refused = answer(client, "wide", StepWork(1))
    assert isinstance(refused, WorkerError)
    assert refused.code == "INVALID_ARGUMENT"
    assert refused.message.startswith("the batch of step 1 would be 13")  # 8 rows of 16 KiB
    assert refused.message.endswith(
        f"more than the {REPLY_LIMIT - 1024} a reply may hold; ask for fewer rows"
    )
    assert row.calls == calls  # no record was read
    # Fewer rows fit.
    assert answer(client, "wide", StepWork(1, rows=np.arange(3))) is None


def test_a_batch_whose_size_rows_do_not_tell_is_refused_once_built(
    serve: tuple[Worker, GrpcTransport | ZmqTransport],
) -> None:
    _, client = serve
    # The probes (1 and 2 rows) say 3 KiB a row; 4 rows of step 0 take 16 KiB, of step 7 240.
    assert answer(client, "growing", StepWork(0, rows=np.arange(4))) is None
    refused = answer(client, "growing", StepWork(7, rows=np.arange(4)))
    assert isinstance(refused, WorkerError)
    assert refused.code == "INVALID_ARGUMENT"
    assert "the batch of step 7 would be" in refused.message
    assert refused.message.endswith("a reply may hold; ask for fewer rows")


def worker_row(worker: Worker) -> failure_pipelines.Row:
    """The counting record function of the worker's `wide` pipeline."""
    row = worker._pipelines["wide"].records._fn  # type: ignore[attr-defined]
    assert isinstance(row, failure_pipelines.Row)
    return row
