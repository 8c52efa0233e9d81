"""The worker server: its config, the `loadax-worker` CLI, and real workers over gRPC."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pipelines
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import assert_batches_equal
from workers import WorkerProcess, worker_env, worker_process, write_config

import loadax
from loadax.errors import WorkerError
from loadax.plan.planner import Plan
from loadax.server.config import PipelineConfig, load_config
from loadax.server.config_checks import ConfigError
from loadax.server.grpc_server import SERVICE, GrpcServer
from loadax.server.memory import MemoryBudget, default_budget
from loadax.server.share_cache import ShareCache
from loadax.server.worker import Worker
from loadax.wire.checksum import payload_checksum
from loadax.wire.codec import decode
from loadax.wire.failures import ERROR_METADATA
from loadax.wire.plans import plan_to_wire, request_digest
from loadax.wire.shared_memory import ClientFile
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

SERVED = (
    pipelines.SERVED
    + """
[pipelines.failing]
factory = "pipelines:failing"
args = { records = 20, bad = 7 }
"""
)
SLOW = """
[pipelines.slow]
factory = "pipelines:slow"
args = { records = 8, delay = 1.0 }
"""
GOOD = """
[server]
grpc = "0.0.0.0:50051"
zmq = "tcp://0.0.0.0:50052"
threads = 8
max_in_flight_per_client = 3

[pipelines.images]
factory = "pipelines:images"
args = { records = 10, side = 4 }

[pipelines.numbers]
factory = "pipelines:numbers"
"""
TIMEOUT = 30.0


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.toml"
    path.write_text(text)
    return path


def config_error(tmp_path: Path, text: str) -> str:
    """The message of the ConfigError that loading and building `text` raises."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        Worker.from_config(load_config(path))
    message = str(raised.value)
    assert message.startswith(f"{path}: "), message
    return message


# --- the config file ------------------------------------------------------------------------


def test_a_good_config_parses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.grpc == "0.0.0.0:50051"
    assert config.zmq == "tcp://0.0.0.0:50052"
    assert (config.threads, config.max_in_flight_per_client) == (8, 3)
    assert config.pipelines == (
        PipelineConfig("images", "pipelines:images", {"records": 10, "side": 4}),
        PipelineConfig("numbers", "pipelines:numbers", {}),
    )


def test_limits_have_defaults_and_one_transport_is_enough(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[server]\nzmq = "tcp://127.0.0.1:0"\n' + SERVED))
    assert (config.grpc, config.zmq) == (None, "tcp://127.0.0.1:0")
    assert (config.threads, config.max_in_flight_per_client) == (4, 16)


def test_command_line_addresses_replace_the_files(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), grpc="[::1]:0", zmq="tcp://127.0.0.1:0")
    assert (config.grpc, config.zmq) == ("[::1]:0", "tcp://127.0.0.1:0")
    with pytest.raises(ConfigError, match=r"--grpc must be \"host:port\".*\"nowhere\""):
        load_config(write(tmp_path, GOOD), grpc="nowhere")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=rf"^{path}: cannot read the config: No such file"):
        load_config(path)


SERVER = '[server]\ngrpc = "127.0.0.1:0"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[server\n", "invalid TOML: Expected ']' at the end of a table declaration (at line 1"),
        (
            SERVER + "thread = 8\n" + SERVED,
            "unknown key [server].thread (did you mean 'threads'?); expected one of: grpc, zmq",
        ),
        (SERVER + "[pipeline.x]\n" + SERVED, "unknown key pipeline (did you mean 'pipelines'?)"),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines:numbers"\narg = {}\n',
            "unknown key [pipelines.x].arg (did you mean 'args'?)",
        ),
        ("[server]\nthreads = 2\n" + SERVED, "[server] needs grpc (a host:port) or zmq"),
        (SERVED, "[server] needs grpc"),
        ('[server]\ngrpc = "localhost"\n' + SERVED, '[server].grpc must be "host:port"'),
        ('[server]\ngrpc = "localhost:99999"\n' + SERVED, 'got "localhost:99999"'),
        ("[server]\ngrpc = 50051\n" + SERVED, '[server].grpc must be "host:port" (port 0'),
        ('[server]\nzmq = "127.0.0.1:5"\n' + SERVED, '[server].zmq must be "tcp://host:port"'),
        ('[server]\nzmq = "udp://127.0.0.1:5"\n' + SERVED, '[server].zmq must be "tcp://'),
        ('[server]\ngrpc = "*:5"\n' + SERVED, '[server].grpc must be "host:port"'),
        (SERVER + "metrics = 9400\n" + SERVED, '[server].metrics must be "host:port" (port 0'),
        (SERVER + 'metrics = "localhost"\n' + SERVED, '[server].metrics must be "host:port"'),
        (
            '[server]\ngrpc = "no-such-host.invalid:50051"\n' + SERVED,
            "[server].grpc: the host 'no-such-host.invalid' does not resolve",
        ),
        (
            '[server]\nzmq = "tcp://no-such-host.invalid:50052"\n' + SERVED,
            "[server].zmq: the host 'no-such-host.invalid' does not resolve",
        ),
        (SERVER + 'metrics = "*:9400"\n' + SERVED, 'got "*:9400"'),
        (SERVER + 'metric = ":9400"\n' + SERVED, "unknown key [server].metric (did you mean"),
        (SERVER + 'threads = "8"\n' + SERVED, '[server].threads must be an int >= 1, got "8"'),
        (SERVER + "threads = 0\n" + SERVED, "[server].threads must be an int >= 1, got 0"),
        (SERVER + "threads = true\n" + SERVED, "[server].threads must be an int >= 1, got true"),
        (
            SERVER + "max_in_flight_per_client = -1\n" + SERVED,
            "[server].max_in_flight_per_client must be an int >= 1, got -1",
        ),
        (SERVER, "no pipelines: add at least one [pipelines.NAME] table"),
        ("pipelines = 3\n" + SERVER, "pipelines must be tables [pipelines.NAME], got 3"),
        ("pipelines = { x = 3 }\n" + SERVER, "[pipelines.x] must be a table, got 3"),
        ('server = "x"\n' + SERVED, '[server] must be a table, got "x"'),
        (SERVER + "[pipelines.x]\n", "[pipelines.x].factory is missing"),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines.numbers"\n',
            '[pipelines.x].factory must be "module:function"',
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines:numbers"\nargs = 3\n',
            "[pipelines.x].args must be a table, got 3",
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "no_such_module_here:f"\n',
            "[pipelines.x].factory: module 'no_such_module_here' is not importable",
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines:nothing"\n',
            "[pipelines.x].factory: 'pipelines' has no attribute 'nothing'",
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "workers:PIPELINES"\n',
            "[pipelines.x].factory: 'workers:PIPELINES' is a str, not a callable",
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines:exploding"\n',
            "[pipelines.x].factory: pipelines:exploding(**{}) raised RuntimeError: "
            "the factory exploded",
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines:numbers"\nargs = { rows = 3 }\n',
            '[pipelines.x].factory: pipelines:numbers(**{"rows": 3}) raised TypeError',
        ),
        (
            SERVER + '[pipelines.x]\nfactory = "pipelines:not_a_pipeline"\n',
            "[pipelines.x].factory: pipelines:not_a_pipeline must return a loadax.Pipeline, "
            "got int: 42",
        ),
    ],
)
def test_every_config_error_names_the_file_and_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in config_error(tmp_path, text)


def test_the_fingerprint_covers_factory_and_args(tmp_path: Path) -> None:
    def fingerprints(pipelines_toml: str) -> dict[str, str]:
        worker = Worker.from_config(load_config(write(tmp_path, SERVER + pipelines_toml)))
        try:
            return {p.name: p.fingerprint for p in worker.info(wire.InfoRequest()).pipelines}
        finally:
            worker.close()

    table = '[pipelines.p]\nfactory = "pipelines:{}"\nargs = {{ records = {} }}\n'
    base = fingerprints(table.format("numbers", 20))
    assert fingerprints(table.format("numbers", 20)) == base
    assert fingerprints(table.format("numbers", 21)) != base
    assert fingerprints(table.format("slow", 20)) != base


def test_worker_from_config_serves_the_configured_pipelines(tmp_path: Path) -> None:
    worker = Worker.from_config(write(tmp_path, GOOD))
    try:
        info = worker.info(wire.InfoRequest())
        assert {(p.name, p.num_records) for p in info.pipelines} == {
            ("images", 10),
            ("numbers", 100),
        }
    finally:
        worker.close()


# --- the command line -----------------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadax.server.main", *args],
        capture_output=True,
        text=True,
        env=worker_env(),
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_check_prints_one_line_per_pipeline(tmp_path: Path) -> None:
    result = run_cli("--config", str(write(tmp_path, GOOD)), "--check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith('images: pipelines:images(**{"records": 10, "side": 4}) -> 10 ')
    assert lines[1].startswith("numbers: pipelines:numbers(**{}) -> 100 records, fingerprint ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SERVER + "max_inflight = 3\n" + SERVED, "unknown key [server].max_inflight"),
        (SERVER + '[pipelines.x]\nfactory = "pipelines:exploding"\n', "the factory exploded"),
        (SERVER + '[pipelines.x]\nfactory = "pipelines:not_a_pipeline"\n', "got int: 42"),
    ],
)
def test_check_refuses_a_bad_config_with_status_2(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    result = run_cli("--config", str(path), "--check", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"loadax-worker: {path}: "), result.stderr
    assert expected in result.stderr


def test_check_json_reports_pipelines_addresses_and_security(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret-token-0123456789abcdef")
    text = '[server]\ngrpc = "127.0.0.1:50051"\ntoken_file = "token"\n' + pipelines.SERVED
    path = write(tmp_path, text)
    result = run_cli("--config", str(path), "--check", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    fingerprints = [p.pop("fingerprint") for p in report["pipelines"]]
    assert all(len(fingerprint) == 64 for fingerprint in fingerprints)
    assert report == {
        "valid": True,
        "config": str(path),
        "grpc": "127.0.0.1:50051",
        "zmq": None,
        "metrics": None,
        "pipelines": [
            {
                "name": "numbers",
                "factory": "pipelines:numbers",
                "args": {"records": 30},
                "num_records": 30,
            },
            {
                "name": "images",
                "factory": "pipelines:images",
                "args": {"records": 40, "side": 8},
                "num_records": 40,
            },
        ],
        "security": ["token: required on every request"],
        "memory_budget_bytes": default_budget(),
        "problems": [],
    }


def test_check_json_refuses_a_bad_config_with_status_2_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, SERVER + "max_inflight = 3\n" + SERVED)
    result = run_cli("--config", str(path), "--check", "--json", cwd=tmp_path)
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert (report["valid"], report["config"]) == (False, str(path))
    assert report["error"].startswith(f"{path}: unknown key [server].max_inflight")


def test_check_names_a_missing_config(tmp_path: Path) -> None:
    result = run_cli("--config", str(tmp_path / "absent.toml"), "--check", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"loadax-worker: {tmp_path / 'absent.toml'}: cannot read")


def test_json_without_check_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("--config", str(write(tmp_path, GOOD)), "--json", cwd=tmp_path)
    assert result.returncode == 2
    assert "--json goes with --check" in result.stderr


def test_a_bad_address_override_is_refused_with_status_2(tmp_path: Path) -> None:
    result = run_cli("--config", str(write(tmp_path, GOOD)), "--zmq", "tcp://x", cwd=tmp_path)
    assert result.returncode == 2
    assert '--zmq must be "tcp://host:port"' in result.stderr


def test_help_documents_every_flag() -> None:
    script = Path(sys.executable).with_name("loadax-worker")
    result = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    flags = (
        "--config",
        "--check",
        "--json",
        "--grpc",
        "--zmq",
        "--metrics",
        "--grace",
        "--log-level",
        "--log-format",
        "--processes",
    )
    for flag in (*flags, "--help"):
        assert flag in result.stdout
    assert '"event": "ready"' in result.stdout


# --- a real worker over gRPC ----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("served"), SERVED) as worker:
        yield worker


@pytest.fixture
def channel(served: WorkerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(
        served.grpc_address, options=[("grpc.max_receive_message_length", 1 << 30)]
    ) as opened:
        yield opened


@pytest.fixture
def stub(channel: grpc.Channel) -> worker_pb2_grpc.WorkerStub:
    return worker_pb2_grpc.WorkerStub(channel)


def refusal(call: Callable[..., Any], request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(request, timeout=TIMEOUT)
    return raised.value


def handshake(stub: Any, pipeline: str, plan: Plan) -> wire.HandshakeResponse:
    response: wire.HandshakeResponse = stub.Handshake(
        wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(plan)
        ),
        timeout=TIMEOUT,
    )
    return response


def batch_request(
    stub: Any, pipeline: str, plan: Plan, step: int, rows: list[int] | None = None
) -> wire.BatchRequest:
    return wire.BatchRequest(
        pipeline=pipeline,
        fingerprint=handshake(stub, pipeline, plan).fingerprint,
        plan=plan_to_wire(plan),
        step=step,
        rows=rows or [],
    )


def test_a_handshake_answers_fingerprint_length_and_schema(stub: Any) -> None:
    response = handshake(stub, "images", Plan(0, batch_size=4))
    assert (response.pipeline, response.num_records) == ("images", 40)
    assert response.library_version == loadax.__version__
    assert response.loading_slots == 2  # the config's threads: what the worker loads at once
    assert response.schema.tree == "{'image': *, 'label': *}"
    assert [(leaf.dtype, leaf.ndim, leaf.rows_first) for leaf in response.schema.leaves] == [
        ("<f4", 4, True),
        ("<i4", 1, True),
    ]
    info = stub.Info(wire.InfoRequest(), timeout=TIMEOUT)
    assert {p.name: p.fingerprint for p in info.pipelines}["images"] == response.fingerprint
    assert [p.name for p in info.pipelines] == ["numbers", "images", "failing"]


def test_an_unknown_pipeline_is_not_found_naming_both(stub: Any, served: WorkerProcess) -> None:
    request = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline="imagez", plan=plan_to_wire(Plan(0, 4))
    )
    error = refusal(stub.Handshake, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "'imagez'" in error.details()
    assert "['failing', 'images', 'numbers']" in error.details()
    served.wait_for_output("Handshake from ")
    served.wait_for_output("refused: NOT_FOUND unknown pipeline 'imagez'")


def test_an_incompatible_library_version_fails_the_precondition(stub: Any) -> None:
    request = wire.HandshakeRequest(
        library_version="0.1.0", pipeline="numbers", plan=plan_to_wire(Plan(0, 4))
    )
    error = refusal(stub.Handshake, request)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'0.1.0'" in error.details()


def test_a_wrong_fingerprint_fails_the_precondition(stub: Any) -> None:
    request = batch_request(stub, "numbers", Plan(30, 4), step=0)
    request.fingerprint = "0" * 64
    error = refusal(stub.LoadBatch, request)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "fingerprint" in error.details()


def test_a_step_past_the_end_of_the_plan_is_out_of_range(stub: Any) -> None:
    error = refusal(stub.LoadBatch, batch_request(stub, "numbers", Plan(30, 4), step=8))
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "step 8 is beyond the plan's 8 steps" in error.details()


def test_rows_outside_the_batch_are_an_invalid_argument(stub: Any) -> None:
    # The last batch of 30 records in batches of 4 has 2 rows.
    error = refusal(stub.LoadBatch, batch_request(stub, "numbers", Plan(30, 4), 7, rows=[1, 2]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batch of 2 rows" in error.details()


def test_a_failing_record_is_aborted_naming_it_and_the_worker_keeps_serving(
    stub: Any, served: WorkerProcess
) -> None:
    plan = Plan(20, batch_size=4)
    error = refusal(stub.LoadBatch, batch_request(stub, "failing", plan, step=1))
    assert error.code() == grpc.StatusCode.ABORTED
    assert error.details() == "record 7 (epoch 0) failed: ValueError: record 7 is corrupt"
    # The record's parts, for the client to raise RecordError: in the trailing metadata.
    (carried,) = [value for key, value in error.trailing_metadata() if key == ERROR_METADATA]
    record = wire.ErrorReply.FromString(carried).record
    assert (record.index, record.epoch, record.cause_type) == (7, 0, "ValueError")
    assert record.cause_message == "record 7 is corrupt"
    assert record.traceback.startswith("Traceback (most recent call last)")
    served.wait_for_output("LoadBatch from ")
    served.wait_for_output("refused: ABORTED record 7")
    response = stub.LoadBatch(batch_request(stub, "failing", plan, step=0), timeout=TIMEOUT)
    np.testing.assert_array_equal(decode(response.payload)["x"], [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("pipeline", "plan", "step", "rows"),
    [
        ("numbers", Plan(30, batch_size=4), 0, None),
        ("numbers", Plan(30, batch_size=4, shuffle=True, seed=3, num_epochs=2), 12, [0, 1]),
        ("images", Plan(40, batch_size=8, shuffle=True, seed=5, num_epochs=None), 11, [1, 4, 6]),
    ],
)
def test_a_batch_decodes_to_what_the_pipeline_loads_locally(
    stub: Any, pipeline: str, plan: Plan, step: int, rows: list[int] | None
) -> None:
    request = batch_request(stub, pipeline, plan, step, rows)
    response = stub.LoadBatch(request, timeout=TIMEOUT)
    assert response.step == step
    # The schema's method carries the same header as the raw one.
    assert response.fingerprint == request.fingerprint
    assert response.request_digest == request_digest(request)
    assert response.checksum == payload_checksum([response.payload])
    assert response.payload_size == len(response.payload)
    # Its load (`loadax.wire.load`): at least this request, per slot of its 2 threads.
    assert (response.load > 0.0, response.loading_slots) == (True, 2)
    local = {"numbers": pipelines.numbers(30), "images": pipelines.images(40, side=8)}[pipeline]
    assert_batches_equal([decode(response.payload)], [local.load(plan, step, rows)])


def test_malformed_and_oversized_requests_are_refused_and_the_worker_keeps_serving(
    channel: grpc.Channel, stub: Any
) -> None:
    raw = channel.unary_unary("/loadax.wire.v1.Worker/LoadBatch")
    error = refusal(raw, b"\xff\xff\xff")
    assert error.code() == grpc.StatusCode.INTERNAL
    error = refusal(raw, b"\x0a" + b"\x80\x80\x80\x04" + b"x" * (8 << 20))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert handshake(stub, "numbers", Plan(0, 4)).num_records == 30


def test_health_reports_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "loadax.wire.v1.Worker"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_worker_and_health_services(channel: grpc.Channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = reflection.ServerReflectionInfo(iter([request]), timeout=TIMEOUT)
    services = {service.name for service in next(responses).list_services_response.service}
    assert {"loadax.wire.v1.Worker", "grpc.health.v1.Health"} <= services


def test_sigterm_finishes_the_request_in_flight_and_exits_0(tmp_path: Path) -> None:
    with (
        worker_process(tmp_path, SLOW) as worker,
        grpc.insecure_channel(worker.grpc_address) as channel,
    ):
        stub = worker_pb2_grpc.WorkerStub(channel)
        plan = Plan(8, batch_size=2)
        # Records 0-3 are read at start-up (the identity's probe): this request reads 6 and 7.
        call = stub.LoadBatch.future(batch_request(stub, "slow", plan, step=3), timeout=TIMEOUT)
        worker.wait_for_output("reading record 6")
        assert worker.terminate() == 0
        np.testing.assert_array_equal(decode(call.result().payload)["x"], [6, 7])
        assert worker.output().splitlines().count('{"event": "stopped"}') == 1
        assert "SIGTERM received" in worker.output()


def test_a_client_over_its_in_flight_limit_is_refused(tmp_path: Path) -> None:
    with (
        # 4 loading threads: the first call's 2 records may take 2, and the other's must start.
        worker_process(tmp_path, SLOW, max_in_flight_per_client=1, threads=4) as worker,
        grpc.insecure_channel(worker.grpc_address) as channel,
        # Its own connection: another client, as far as the worker can tell.
        grpc.insecure_channel(
            worker.grpc_address, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as other_channel,
    ):
        stub = worker_pb2_grpc.WorkerStub(channel)
        other = worker_pb2_grpc.WorkerStub(other_channel)
        plan = Plan(8, batch_size=2)
        # Records 0-3 are read at start-up (the identity's probe): the first call reads 6 and 7.
        first = stub.LoadBatch.future(batch_request(stub, "slow", plan, 3), timeout=TIMEOUT)
        worker.wait_for_output("reading record 6")
        error = refusal(stub.LoadBatch, batch_request(stub, "slow", plan, 1))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_in_flight_per_client = 1" in error.details()
        from_other = other.LoadBatch.future(batch_request(other, "slow", plan, 2), timeout=TIMEOUT)
        worker.wait_for_output("reading record 4")
        assert not first.done(), "the two clients' calls should overlap"
        np.testing.assert_array_equal(decode(first.result().payload)["x"], [6, 7])
        np.testing.assert_array_equal(decode(from_other.result().payload)["x"], [4, 5])
        # The finished call no longer counts.
        again = stub.LoadBatch(batch_request(stub, "slow", plan, 0), timeout=TIMEOUT)
        np.testing.assert_array_equal(decode(again.payload)["x"], [0, 1])


class _BrokenWorker:
    """Answers handshakes, fails every batch with an unexpected error."""

    serving = True
    shared_memory = False
    share_cache = ShareCache(MemoryBudget(1 << 20, wait_s=1.0), capacity=0)

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        return wire.HandshakeResponse(pipeline=request.pipeline, num_records=1)

    def load_batch(
        self,
        request: wire.BatchRequest,
        max_reply_bytes: int | None = None,
        *,
        checksummed: bool = True,
        into: ClientFile | None = None,
    ) -> wire.BatchResponse:
        raise KeyError("a bug in the worker")

    def info(self, request: wire.InfoRequest) -> wire.InfoResponse:
        raise WorkerError("UNAVAILABLE", "not now")


def broken_server(address: str = "127.0.0.1:0", max_in_flight_per_client: int = 1) -> GrpcServer:
    """A gRPC server, not started, around a worker that fails in every way a bug can."""
    return GrpcServer(
        _BrokenWorker(),  # type: ignore[arg-type]
        address,
        threads=1,
        max_in_flight_per_client=max_in_flight_per_client,
    )


def test_an_unexpected_failure_is_internal_and_the_server_keeps_serving() -> None:
    server = broken_server(max_in_flight_per_client=2)
    address = server.start()
    try:
        assert address.startswith("127.0.0.1:")
        assert not address.endswith(":0")
        with grpc.insecure_channel(address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            error = refusal(stub.LoadBatch, wire.BatchRequest(pipeline="p"))
            assert error.code() == grpc.StatusCode.INTERNAL
            assert "KeyError: 'a bug in the worker'" in error.details()
            error = refusal(stub.Info, wire.InfoRequest())
            assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE, "not now")
            response = stub.Handshake(wire.HandshakeRequest(pipeline="p"), timeout=TIMEOUT)
            assert response.pipeline == "p"
    finally:
        server.stop(grace=5)


def test_stop_refuses_new_calls() -> None:
    server = broken_server()
    address = server.start()
    server.stop(grace=5)
    with grpc.insecure_channel(address) as channel:
        error = refusal(worker_pb2_grpc.WorkerStub(channel).Handshake, wire.HandshakeRequest())
        assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_two_workers_cannot_share_a_port() -> None:
    first = broken_server()
    address = first.start()
    try:
        second = broken_server(address)
        with pytest.raises(OSError, match=f"gRPC cannot listen on {address}"):
            second.start()
        second.stop(grace=0)
    finally:
        first.stop(grace=0)


def test_a_taken_port_exits_1(tmp_path: Path) -> None:
    server = broken_server()
    address = server.start()
    try:
        config = write_config(tmp_path, SERVED)
        result = run_cli("--config", str(config), "--grpc", address, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert f"cannot start: gRPC cannot listen on {address}" in result.stderr
        assert result.stdout == ""
    finally:
        server.stop(grace=0)


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    with (
        worker_process(tmp_path, SLOW) as worker,
        grpc.insecure_channel(worker.grpc_address) as channel,
    ):
        stub = worker_pb2_grpc.WorkerStub(channel)
        call = stub.LoadBatch.future(batch_request(stub, "slow", Plan(8, 8), 0), timeout=TIMEOUT)
        worker.wait_for_output("reading record 4")  # 0-3 are read at start-up too
        worker.process.send_signal(signal.SIGINT)
        assert worker.terminate() == 1
        assert "again: exiting without waiting" in worker.output()
        assert '"stopped"' not in worker.output()
        with pytest.raises(grpc.RpcError):
            call.result()


@pytest.mark.parametrize("grpc_too", [True, False])
def test_a_worker_announces_and_stops_its_zeromq_endpoint(tmp_path: Path, grpc_too: bool) -> None:
    with worker_process(tmp_path, SLOW, grpc=grpc_too, zmq=True) as worker:
        assert worker.zmq is not None
        assert worker.zmq.startswith("zmq://127.0.0.1:")
        assert not worker.zmq.endswith(":0")
        assert (worker.grpc is not None) == grpc_too
        assert worker.pipelines == ["slow"]
        assert worker.terminate() == 0
        assert '{"event": "stopped"}' in worker.output().splitlines()


def test_stopping_reports_not_serving_to_health_watchers() -> None:
    server = broken_server()
    stopper = threading.Thread(target=server.stop, args=(TIMEOUT,))
    with grpc.insecure_channel(server.start()) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=TIMEOUT
        )
        try:
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            stopper.start()
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            watch.cancel()  # the watch is a call in flight: stop waits for it
            if stopper.is_alive():
                stopper.join()
            else:
                server.stop(grace=0)
