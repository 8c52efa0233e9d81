"""With `log_format = "json"`, every worker event carries its facts as fields (event, worker,
pipeline, step, client, status, duration, error), not only in its text: a real worker's stderr,
line by line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from workers import worker_process

import loadax
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import WorkerError
from loadax.logfields import NAMES
from loadax.plan.work import StepWork
from loadax.wire.failures import PipelineFailed
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

PIPELINES = """
[pipelines.ragged]
factory = "failure_pipelines:ragged"
"""
PLAN = loadax.Plan(64, batch_size=4)
WAIT_S = 30.0
RECORD_KEYS = {"time", "level", "logger", "message", "traceback", "stack"}


def hello(pipeline: str) -> wire.HandshakeRequest:
    return wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(PLAN)
    )


def events(stderr: str) -> list[dict[str, Any]]:
    """Every line of `stderr`, each a JSON object of a record's keys and fields only."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    for line in lines:
        assert set(line) <= RECORD_KEYS | set(NAMES), line
    return lines


def test_the_workers_events_carry_their_facts_as_fields(tmp_path: Path) -> None:
    with worker_process(
        tmp_path, PIPELINES, grpc=True, zmq=True, args=["--log-format", "json"]
    ) as worker:
        for client in (GrpcTransport(worker.address("grpc")), ZmqTransport(worker.address("zmq"))):
            try:
                fingerprint = client.handshake(hello("ragged")).fingerprint
                request = batch_request("ragged", fingerprint, PLAN, StepWork(3))
                assert isinstance(client.send(request).exception(WAIT_S), PipelineFailed)
                with pytest.raises(WorkerError, match="NOT_FOUND"):
                    client.handshake(hello("images"))
            finally:
                client.close()
        assert worker.terminate() == 0
        lines = events(_stderr(worker.output()))
    by_event: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_event.setdefault(line.get("event", ""), []).append(line)

    (ready,) = by_event["ready"]
    assert ready["worker"] == [worker.address("grpc"), worker.address("zmq")]
    (probe,) = by_event["probe_failed"]  # a ragged pipeline has no probe batch
    assert probe["pipeline"] == "ragged"
    assert "ValueError" in probe["error"]

    failed = by_event["failed"]
    batches = [line for line in failed if line.get("step") == 3]
    assert len(batches) == 2  # one per transport
    for line in batches:
        assert (line["pipeline"], line["status"], line["level"]) == ("ragged", "ABORTED", "WARNING")
        assert line["error"].startswith("the batch of step 3 failed: ValueError: leaf ['tokens']")
        assert isinstance(line["duration_s"], float)
        assert line["duration_s"] >= 0
    zmq_client, grpc_client = sorted(line["client"] for line in batches)
    assert zmq_client.startswith("client ")  # a ZeroMQ routing identity
    assert grpc_client.startswith("ipv4:127.0.0.1:")  # a gRPC peer
    unknown = [line for line in failed if line.get("status") == "NOT_FOUND"]
    assert [line["pipeline"] for line in unknown] == ["images", "images"]
    assert "step" not in unknown[0]

    (stopping,) = by_event["stopping"]
    (stopped,) = by_event["stopped"]
    assert stopping["worker"] == stopped["worker"] == ready["worker"]
    assert stopped["duration_s"] >= 0


def _stderr(output: str) -> str:
    """The log lines of a worker's output, without its stdout's ready and stopped lines."""
    return "\n".join(line for line in output.splitlines() if not line.startswith('{"event": '))
