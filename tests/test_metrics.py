"""The worker's Prometheus metrics: what each transport counts, and a real worker's /metrics."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pipelines
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from workers import worker_env, worker_with_settings, write_config

import loadax
from loadax.errors import WorkerError
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork
from loadax.server.config import load_config
from loadax.server.config_checks import ConfigError
from loadax.server.grpc_server import GrpcServer
from loadax.server.memory import MemoryBudget
from loadax.server.metrics import WorkerMetrics
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

TIMEOUT = 30.0
TOKEN = "metrics-token-0123456789"
NUMBERS = """
[pipelines.numbers]
factory = "pipelines:numbers"
args = { records = 30 }
"""
PLAN = Plan(30, batch_size=4)
# No proxy from the environment between the tests and the loopback exporter.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
RESERVED = ("loadax_worker_memory_reserved_bytes", frozenset())


def scrape(address: str) -> Samples:
    """Every sample at http://`address`/metrics, by name and labels."""
    with _HTTP.open(f"http://{address}/metrics", timeout=TIMEOUT) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def settled(address: str) -> Samples:
    """`scrape(address)` once every sent batch's budget share is back: a ZeroMQ reply's share
    is released when libzmq has sent it, a moment after the client has it."""
    deadline = time.monotonic() + TIMEOUT
    while (samples := scrape(address))[RESERVED] and time.monotonic() < deadline:
        time.sleep(0.01)
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# --- counting --------------------------------------------------------------------------------


def test_observe_counts_answers_errors_and_batch_bytes() -> None:
    metrics = WorkerMetrics()
    batch = wire.BatchRequest(pipeline="numbers", step=0)

    def answer() -> EncodedBatch:
        assert value(metrics, "loadax_worker_in_flight", transport="grpc") == 1
        return EncodedBatch(0, [bytes(60), bytes(40)])

    def refuse() -> EncodedBatch:
        raise WorkerError("OUT_OF_RANGE", "step 9 is beyond the plan's 8 steps")

    def fail() -> EncodedBatch:
        raise ValueError("a bug")

    assert metrics.observe("grpc", batch, answer).payload == bytes(100)
    assert metrics.observe("grpc", batch, answer).payload == bytes(100)
    with pytest.raises(WorkerError, match="OUT_OF_RANGE"):
        metrics.observe("grpc", batch, refuse)
    with pytest.raises(ValueError, match="a bug"):
        metrics.observe("zmq", batch, fail)
    metrics.observe("zmq", wire.InfoRequest(), wire.InfoResponse)

    requests = "loadax_worker_requests_total"
    assert value(metrics, requests, method="LoadBatch", transport="grpc", code="OK") == 2
    assert value(metrics, requests, method="LoadBatch", transport="grpc", code="OUT_OF_RANGE") == 1
    assert value(metrics, requests, method="LoadBatch", transport="zmq", code="INTERNAL") == 1
    assert value(metrics, requests, method="Info", transport="zmq", code="OK") == 1
    assert value(metrics, "loadax_worker_errors_total", code="OUT_OF_RANGE") == 1
    assert value(metrics, "loadax_worker_errors_total", code="INTERNAL") == 1
    assert value(metrics, "loadax_worker_batches_total", pipeline="numbers") == 2
    assert value(metrics, "loadax_worker_bytes_sent_total", pipeline="numbers") == 200
    seconds = "loadax_worker_request_seconds_count"
    assert value(metrics, seconds, method="LoadBatch", transport="grpc") == 3
    assert value(metrics, "loadax_worker_in_flight", transport="grpc") == 0
    assert value(metrics, "loadax_worker_in_flight", transport="zmq") == 0


def test_refusals_count_methods_a_client_made_up_as_unknown() -> None:
    metrics = WorkerMetrics()
    metrics.refused("zmq", "LoadBatch", "RESOURCE_EXHAUSTED")
    metrics.refused("zmq", "x" * 64, "INVALID_ARGUMENT")
    metrics.refused("grpc", "Whatever", "UNAUTHENTICATED")
    requests = "loadax_worker_requests_total"
    exhausted = {"method": "LoadBatch", "transport": "zmq", "code": "RESOURCE_EXHAUSTED"}
    assert value(metrics, requests, **exhausted) == 1
    assert value(metrics, requests, method="unknown", transport="zmq", code="INVALID_ARGUMENT") == 1
    assert value(metrics, requests, method="unknown", transport="grpc", code="UNAUTHENTICATED") == 1
    assert value(metrics, "loadax_worker_errors_total", code="UNAUTHENTICATED") == 1
    # Refused on arrival: not timed.
    assert (
        value(metrics, "loadax_worker_request_seconds_count", method="LoadBatch", transport="zmq")
        is None
    )


def test_the_memory_gauges_follow_the_budget_and_are_absent_without_one() -> None:
    budget = MemoryBudget(1000, wait_s=TIMEOUT)
    metrics = WorkerMetrics(budget)
    assert value(metrics, "loadax_worker_memory_budget_bytes") == 1000
    assert value(metrics, "loadax_worker_memory_reserved_bytes") == 0
    release = budget.reserve(("numbers", 4), StepWork(0))  # a kind never seen: the whole budget
    assert value(metrics, "loadax_worker_memory_reserved_bytes") == budget.reserved == 1000
    release()
    assert value(metrics, "loadax_worker_memory_reserved_bytes") == 0
    assert value(WorkerMetrics(), "loadax_worker_memory_budget_bytes") is None


def test_grpc_counts_calls_and_token_refusals() -> None:
    metrics = WorkerMetrics()
    worker = Worker({"numbers": pipelines.numbers(30)}, threads=1)
    server = GrpcServer(
        worker, "127.0.0.1:0", threads=1, max_in_flight_per_client=1, token=TOKEN, metrics=metrics
    )
    try:
        with grpc.insecure_channel(server.start()) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            stub.Info(
                wire.InfoRequest(), timeout=TIMEOUT, metadata=[("authorization", f"Bearer {TOKEN}")]
            )
            with pytest.raises(grpc.RpcError) as refused:
                stub.Info(wire.InfoRequest(), timeout=TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(grace=0)
        worker.close()
    requests = "loadax_worker_requests_total"
    assert value(metrics, requests, method="Info", transport="grpc", code="OK") == 1
    assert value(metrics, requests, method="Info", transport="grpc", code="UNAUTHENTICATED") == 1


def test_zeromq_counts_requests_and_malformed_ones() -> None:
    metrics = WorkerMetrics()
    worker = Worker({"numbers": pipelines.numbers(30)}, threads=1)
    server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=1, metrics=metrics)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        socket.connect(server.start())
        socket.send_multipart(zmq_frames.request_frames(1, wire.InfoRequest()))
        socket.send_multipart([zmq_frames.encode_request_id(2), b"Nope", b""])
        replies = {}
        for _ in range(2):
            assert socket.poll(int(TIMEOUT * 1000)), "no reply"
            reply = socket.recv_multipart()
            replies[zmq_frames.parse_request_id(reply[0])] = reply[1]
        assert replies == {1: zmq_frames.OK, 2: zmq_frames.ERROR}
    finally:
        socket.close(linger=0)
        context.term()
        server.stop(grace=0)
        worker.close()
    requests = "loadax_worker_requests_total"
    assert value(metrics, requests, method="Info", transport="zmq", code="OK") == 1
    assert value(metrics, requests, method="unknown", transport="zmq", code="INVALID_ARGUMENT") == 1


# --- the exporter ----------------------------------------------------------------------------


def test_the_exporter_serves_the_metrics_until_stopped() -> None:
    metrics = WorkerMetrics()
    metrics.refused("grpc", "Info", "UNAVAILABLE")
    address = metrics.start_exporter("127.0.0.1:0")
    try:
        assert address.startswith("127.0.0.1:")
        assert not address.endswith(":0")
        samples = scrape(address)
        assert sample(samples, "loadax_worker_errors_total", code="UNAVAILABLE") == 1
        assert sample(samples, "process_resident_memory_bytes") > 0
        with pytest.raises(RuntimeError, match="started already"):
            metrics.start_exporter("127.0.0.1:0")
    finally:
        metrics.stop_exporter()
    with pytest.raises(urllib.error.URLError):
        scrape(address)
    metrics.stop_exporter()  # a second stop does nothing


def test_the_config_and_the_command_line_set_the_metrics_address(tmp_path: Path) -> None:
    path = write_config(tmp_path, NUMBERS)
    assert load_config(path).metrics is None
    path.write_text(path.read_text().replace("[server]", '[server]\nmetrics = "0.0.0.0:9400"'))
    assert load_config(path).metrics == "0.0.0.0:9400"
    assert load_config(path, metrics="[::1]:0").metrics == "[::1]:0"
    with pytest.raises(ConfigError, match=rf'^{path}: --metrics must be "host:port".*"9400"'):
        load_config(path, metrics="9400")


# --- a real worker ---------------------------------------------------------------------------


def batch_request(fingerprint: str, step: int) -> wire.BatchRequest:
    return wire.BatchRequest(
        pipeline="numbers", fingerprint=fingerprint, plan=plan_to_wire(PLAN), step=step
    )


def grpc_requests(address: str) -> int:
    """A handshake, three batches and a step past the end over gRPC; the payload bytes."""
    with grpc.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        request = wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline="numbers", plan=plan_to_wire(PLAN)
        )
        fingerprint = stub.Handshake(request, timeout=TIMEOUT).fingerprint
        sizes = [
            len(stub.LoadBatch(batch_request(fingerprint, step), timeout=TIMEOUT).payload)
            for step in range(3)
        ]
        with pytest.raises(grpc.RpcError) as refused:
            stub.LoadBatch(batch_request(fingerprint, 99), timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
    return sum(sizes)


def zmq_requests(endpoint: str, fingerprint: str) -> int:
    """Two batches over ZeroMQ; the payload bytes."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        socket.connect(endpoint.replace("zmq://", "tcp://"))
        total = 0
        for step in range(2):
            socket.send_multipart(zmq_frames.request_frames(step, batch_request(fingerprint, step)))
            assert socket.poll(int(TIMEOUT * 1000)), "no reply"
            reply = zmq_frames.parse_batch_reply(socket.recv_multipart())
            total += sum(len(frame) for frame in reply.payload)
        return total
    finally:
        socket.close(linger=0)
        context.term()


def test_a_worker_counts_its_requests_at_slash_metrics_until_it_stops(tmp_path: Path) -> None:
    settings = 'metrics = "127.0.0.1:0"\nmemory_budget_mb = 64'
    with worker_with_settings(tmp_path, settings, NUMBERS, zmq=True) as worker:
        assert worker.metrics is not None
        assert worker.zmq is not None
        grpc_bytes = grpc_requests(worker.grpc_address)
        with grpc.insecure_channel(worker.grpc_address) as channel:
            info = worker_pb2_grpc.WorkerStub(channel).Info(wire.InfoRequest(), timeout=TIMEOUT)
        zmq_bytes = zmq_requests(worker.zmq, info.pipelines[0].fingerprint)
        samples = settled(worker.metrics)
        assert worker.terminate() == 0
        with pytest.raises(urllib.error.URLError):
            scrape(worker.metrics)

    requests = "loadax_worker_requests_total"
    assert sample(samples, requests, method="Handshake", transport="grpc", code="OK") == 1
    assert sample(samples, requests, method="Info", transport="grpc", code="OK") == 1
    assert sample(samples, requests, method="LoadBatch", transport="grpc", code="OK") == 3
    assert sample(samples, requests, method="LoadBatch", transport="grpc", code="OUT_OF_RANGE") == 1
    assert sample(samples, requests, method="LoadBatch", transport="zmq", code="OK") == 2
    assert sample(samples, "loadax_worker_errors_total", code="OUT_OF_RANGE") == 1
    assert sample(samples, "loadax_worker_batches_total", pipeline="numbers") == 5
    sent = sample(samples, "loadax_worker_bytes_sent_total", pipeline="numbers")
    assert sent == grpc_bytes + zmq_bytes
    seconds = "loadax_worker_request_seconds_count"
    assert sample(samples, seconds, method="LoadBatch", transport="grpc") == 4
    assert sample(samples, seconds, method="LoadBatch", transport="zmq") == 2
    assert sample(samples, "loadax_worker_in_flight", transport="grpc") == 0
    assert sample(samples, "loadax_worker_memory_budget_bytes") == 64 << 20
    assert sample(samples, "loadax_worker_memory_reserved_bytes") == 0
    assert sample(samples, "process_resident_memory_bytes") > 0


def test_the_metrics_flag_on_a_taken_port_exits_1(tmp_path: Path) -> None:
    holder = WorkerMetrics()
    taken = holder.start_exporter("127.0.0.1:0")
    try:
        config = write_config(tmp_path, NUMBERS)
        flag = ["--metrics", taken]
        result = subprocess.run(
            [sys.executable, "-m", "loadax.server.main", "--config", str(config), *flag],
            capture_output=True,
            text=True,
            env=worker_env(),
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
    finally:
        holder.stop_exporter()
    assert result.returncode == 1, result.stderr
    assert f"cannot start: the metrics exporter cannot listen on {taken}" in result.stderr
    assert result.stdout == ""
