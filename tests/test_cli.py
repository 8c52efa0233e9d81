"""The `loadax` command line: ping real workers over gRPC and ZeroMQ, check configs, run a suite.

End-to-end paths run the installed console script in a process of its own; the other cases call
`main()` in this process (the same code, without a second interpreter's start-up time).
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import zmq.auth
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pipelines import SERVED
from workers import (
    WorkerProcess,
    worker_env,
    worker_process,
    worker_with_settings,
    write_config,
)

import loadax
from loadax.client import cli
from loadax.server.grpc_server import SERVICE

SCRIPT = Path(sys.executable).with_name("loadax")
TOKEN = "s3cret-token-0123456789abcdef"


@dataclasses.dataclass(frozen=True)
class Result:
    status: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.stdout)
        return parsed


def run_script(*args: str, cwd: Path | None = None) -> Result:
    """The installed `loadax` console script, in a process of its own."""
    done = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=worker_env(),
        cwd=cwd,
        timeout=120,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def run_main(capfd: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`cli.main(args)` in this process, with what it (and its children) printed."""

    def run(*args: str) -> Result:
        try:
            status = cli.main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            status = int(exit_.code or 0)
        out, err = capfd.readouterr()
        return Result(status, out, err)

    return run


# --- workers --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Curve:
    server_public: str
    server_secret: Path  # the worker's certificate file
    client_cert: Path  # allowed by the guarded worker
    stranger_cert: Path  # not allowed


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("served"), SERVED, zmq=True) as worker:
        yield worker


@pytest.fixture(scope="module")
def curve(tmp_path_factory: pytest.TempPathFactory) -> Curve:
    directory = tmp_path_factory.mktemp("curve")
    server_public, server_secret = zmq.auth.create_certificates(directory, "worker")
    _, client_secret = zmq.auth.create_certificates(directory, "client")
    _, stranger_secret = zmq.auth.create_certificates(directory, "stranger")
    return Curve(
        zmq.auth.load_certificate(server_public)[0].decode(),
        Path(server_secret),
        Path(client_secret),
        Path(stranger_secret),
    )


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, curve: Curve) -> Iterator[WorkerProcess]:
    """A token on both transports, and CURVE with an allow-list on ZeroMQ."""
    directory = tmp_path_factory.mktemp("guarded")
    (directory / "token").write_text(TOKEN + "\n")
    allowed = zmq.auth.load_certificate(curve.client_cert)[0].decode()
    settings = f"""
token_file = "token"
[server.curve]
secret_key_file = "{curve.server_secret}"
allowed_clients = ["{allowed}"]
"""
    with worker_with_settings(directory, settings, SERVED, zmq=True) as worker:
        yield worker


@pytest.fixture(scope="module")
def token_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tokens")
    (directory / "right").write_text(TOKEN + "\n")
    (directory / "wrong").write_text("wrong-token-0123456789abcdef\n")
    return {"right": directory / "right", "wrong": directory / "wrong"}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    """A gRPC server with only the health service, whose statuses the test sets."""
    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"grpc://127.0.0.1:{port}", servicer
    finally:
        server.stop(None).wait()


def table(stdout: str) -> dict[str, list[str]]:
    """The rows of ping's output by their first column, split into columns."""
    return {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line}


# --- ping -----------------------------------------------------------------------------------


def test_version_is_the_library_version() -> None:
    result = run_script("--version")
    assert (result.status, result.stdout) == (0, f"loadax {loadax.__version__}\n")


def test_ping_over_grpc_prints_health_pipelines_and_handshakes(served: WorkerProcess) -> None:
    assert served.grpc is not None
    result = run_script("ping", served.grpc)
    assert result.status == 0, result.stderr
    assert result.stderr == ""
    ms = r"\d+\.\d ms"
    expected = f"""\
worker      {re.escape(served.grpc)}
version     loadax {re.escape(loadax.__version__)}
health      SERVING
round trip  {ms}

pipeline  records  fingerprint   handshake
numbers        30  [0-9a-f]{{12}}  ok \\({ms}\\)
images         40  [0-9a-f]{{12}}  ok \\({ms}\\)
"""
    assert re.fullmatch(expected, result.stdout), result.stdout


def test_ping_json_over_zeromq_lists_what_check_reports(
    served: WorkerProcess, run_main: Callable[..., Result], tmp_path: Path
) -> None:
    assert served.zmq is not None
    result = run_script("ping", served.zmq, "--json")
    assert result.status == 0, result.stderr
    report = result.json()
    assert report["ok"] is True
    assert report["address"] == served.zmq
    assert report["health"] is None  # ZeroMQ has no health service
    assert report["library_version"] == loadax.__version__
    assert report["error"] is None
    pipelines = report["pipelines"]
    assert [(p["name"], p["num_records"], p["handshake"]) for p in pipelines] == [
        ("numbers", 30, "ok"),
        ("images", 40, "ok"),
    ]
    timings = [p["round_trip_ms"] for p in pipelines]
    assert all(ms > 0 for ms in timings)
    assert 0 < report["round_trip_ms"] <= min(timings)
    # The same config, checked without a worker, has the same fingerprints.
    checked = run_main("check", str(write_config(tmp_path, SERVED, zmq=True)), "--json")
    assert [(p["name"], p["fingerprint"]) for p in pipelines] == [
        (p["name"], p["fingerprint"]) for p in checked.json()["pipelines"]
    ]


def test_ping_handshakes_only_the_pipeline_asked_for(
    served: WorkerProcess, run_main: Callable[..., Result]
) -> None:
    result = run_main("ping", served.grpc, "--pipeline", "images", "--json")
    assert result.status == 0, result.stderr
    handshakes = {p["name"]: p["handshake"] for p in result.json()["pipelines"]}
    assert handshakes == {"numbers": None, "images": "ok"}


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_pipeline_the_worker_does_not_serve_fails_the_ping(
    served: WorkerProcess, run_main: Callable[..., Result], transport: str
) -> None:
    address = getattr(served, transport)
    result = run_main("ping", address, "--pipeline", "nope")
    assert result.status == 1
    assert table(result.stdout)["nope"] == ["-", "-", "NOT_FOUND"]
    assert result.stderr == (
        f"loadax ping: {address} refused the handshake of pipeline 'nope': NOT_FOUND: unknown "
        "pipeline 'nope': this worker serves ['images', 'numbers']\n"
    )


def test_an_unreachable_grpc_worker_fails_at_once_naming_the_cause(closed_port: int) -> None:
    address = f"grpc://127.0.0.1:{closed_port}"
    result = run_script("ping", address, "--timeout", "60")
    assert result.status == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"loadax ping: cannot reach {address}: UNAVAILABLE: ")
    assert "Connection refused" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_zeromq_worker_fails_at_the_timeout_in_json(
    closed_port: int, run_main: Callable[..., Result]
) -> None:
    address = f"zmq://127.0.0.1:{closed_port}"
    result = run_main("ping", address, "--timeout", "0.2", "--json")
    assert result.status == 1
    assert result.json() == {
        "ok": False,
        "address": address,
        "health": None,
        "library_version": None,
        "round_trip_ms": None,
        "pipelines": [],
        "error": f"cannot reach {address}: DEADLINE_EXCEEDED: {address} did not answer Info "
        "within 0.2 s",
    }


@pytest.mark.parametrize(
    ("status", "shown"),
    [(health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING"), (None, "SERVICE_UNKNOWN")],
)
def test_a_server_whose_health_is_not_serving_fails_the_ping(
    health_server: tuple[str, health.HealthServicer],
    run_main: Callable[..., Result],
    status: int | None,
    shown: str,
) -> None:
    address, servicer = health_server
    if status is not None:
        servicer.set(SERVICE, status)
    result = run_main("ping", address)
    assert result.status == 1
    assert table(result.stdout)["health"] == [shown]
    assert result.stderr == f"loadax ping: {address} is not serving: its health is {shown}\n"


def test_without_the_health_package_ping_says_it_did_not_check_health(
    served: WorkerProcess, run_main: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "health_pb2", None)
    result = run_main("ping", served.grpc, "--json")
    assert result.status == 0
    assert result.json()["health"] is None
    assert "health not checked: it needs grpcio-health-checking" in result.stderr


# --- security -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "refusal"),
    [
        (None, "UNAUTHENTICATED: this worker requires a token"),
        ("wrong", "UNAUTHENTICATED: the token is wrong"),
    ],
)
@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_missing_or_wrong_token_is_refused_with_status_1(
    guarded: WorkerProcess,
    curve: Curve,
    token_files: dict[str, Path],
    run_main: Callable[..., Result],
    transport: str,
    token: str | None,
    refusal: str,
) -> None:
    address = getattr(guarded, transport)
    flags = [] if token is None else ["--token-file", str(token_files[token])]
    if transport == "zmq":
        flags += ["--curve-server-key", curve.server_public]
        flags += ["--curve-client-cert", str(curve.client_cert)]
    result = run_main("ping", address, *flags)
    assert result.status == 1
    assert result.stderr.startswith(f"loadax ping: {address} refused Info: {refusal}")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_the_right_token_and_curve_keys_pass(
    guarded: WorkerProcess,
    curve: Curve,
    token_files: dict[str, Path],
    run_main: Callable[..., Result],
    transport: str,
) -> None:
    flags = ["--token-file", str(token_files["right"])]
    if transport == "zmq":
        flags += ["--curve-server-key", curve.server_public]
        flags += ["--curve-client-cert", str(curve.client_cert)]
    result = run_main("ping", getattr(guarded, transport), *flags, "--json")
    assert result.status == 0, result.stderr
    assert result.json()["ok"] is True


@pytest.mark.parametrize(
    ("certificate", "refusal"),
    [
        (None, "requires CURVE: set ClientSecurity.curve_server_key"),
        ("stranger", "refused this client's CURVE key"),
    ],
)
def test_curve_keys_the_worker_does_not_allow_are_refused(
    guarded: WorkerProcess,
    curve: Curve,
    token_files: dict[str, Path],
    run_main: Callable[..., Result],
    certificate: str | None,
    refusal: str,
) -> None:
    flags = ["--token-file", str(token_files["right"])]
    if certificate is not None:
        flags += ["--curve-server-key", curve.server_public]
        flags += ["--curve-client-cert", str(curve.stranger_cert)]
    result = run_main("ping", guarded.zmq, *flags)
    assert result.status == 1
    assert f"loadax ping: {guarded.zmq} refused Info: UNAUTHENTICATED: " in result.stderr
    assert refusal in result.stderr


# --- usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ping", "http://127.0.0.1:1"], "ADDR must be grpc://host:port or zmq://host:port"),
        (
            ["ping", "grpc://127.0.0.1:1", "--token-file", "{dir}/absent"],
            "--token-file: cannot read",
        ),
        (
            ["ping", "grpc://127.0.0.1:1", "--client-cert", "{pem}", "--client-key", "{pem}"],
            "client_cert: mutual TLS needs ca_cert too",
        ),
        (
            ["ping", "zmq://127.0.0.1:1", "--curve-server-key", "short"],
            "curve_server_key must be a Z85 CURVE key",
        ),
        (
            ["ping", "zmq://127.0.0.1:1", "--curve-client-cert", "{dir}/absent"],
            "--curve-client-cert: ",
        ),
        (["ping", "zmq://127.0.0.1:1", "--curve-client-cert", "{public}"], "has no secret-key"),
        (["ping", "grpc://127.0.0.1:1", "--timeout", "0"], "must be a number of seconds > 0"),
        (["ping", "grpc://127.0.0.1:1", "--quick"], "unrecognized arguments: --quick"),
        (["ping"], "the following arguments are required: ADDR"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_usage_errors_exit_2_naming_the_problem(
    run_main: Callable[..., Result], tmp_path: Path, args: list[str], message: str
) -> None:
    pem, public = tmp_path / "client.pem", tmp_path / "client.key"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    public.write_text(f'curve\n    public-key = "{zmq.curve_keypair()[0].decode()}"\n')
    result = run_main(*(arg.format(pem=pem, public=public, dir=tmp_path) for arg in args))
    assert result.status == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert "Traceback" not in result.stderr


# --- check ----------------------------------------------------------------------------------


def test_check_prints_what_loadax_worker_check_prints(tmp_path: Path) -> None:
    config = write_config(tmp_path, SERVED, zmq=True)
    result = run_script("check", str(config))
    assert result.status == 0, result.stderr
    worker = subprocess.run(
        [str(SCRIPT.with_name("loadax-worker")), "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=120,
        check=True,
    )
    assert result.stdout == worker.stdout
    assert result.stdout.startswith('numbers: pipelines:numbers(**{"records": 30}) -> 30 records')


def test_check_json_reports_pipelines_addresses_and_security(
    tmp_path: Path, run_main: Callable[..., Result]
) -> None:
    (tmp_path / "token").write_text(TOKEN)
    text = '[server]\ngrpc = "127.0.0.1:50051"\ntoken_file = "token"\n' + SERVED
    (tmp_path / "worker.toml").write_text(text)
    result = run_main("check", str(tmp_path / "worker.toml"), "--json")
    assert result.status == 0, result.stderr
    report = result.json()
    fingerprints = [p.pop("fingerprint") for p in report["pipelines"]]
    assert all(len(fingerprint) == 64 for fingerprint in fingerprints)
    assert report == {
        "valid": True,
        "config": str(tmp_path / "worker.toml"),
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
    }


@pytest.mark.parametrize("as_json", [False, True])
def test_check_refuses_a_bad_config_with_status_2_naming_the_key(
    tmp_path: Path, run_main: Callable[..., Result], as_json: bool
) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('[server]\ngrpc = "127.0.0.1:0"\nmax_inflight = 3\n' + SERVED)
    result = run_main("check", str(config), *(["--json"] if as_json else []))
    assert result.status == 2
    if as_json:
        report = result.json()
        assert (report["valid"], report["config"]) == (False, str(config))
        assert report["error"].startswith(f"{config}: unknown key [server].max_inflight")
    else:
        assert result.stdout == ""
        assert result.stderr.startswith(
            f"loadax check: {config}: unknown key [server].max_inflight"
        )


def test_check_names_a_missing_config(run_main: Callable[..., Result], tmp_path: Path) -> None:
    result = run_main("check", str(tmp_path / "absent.toml"))
    assert result.status == 2
    assert result.stderr.startswith(f"loadax check: {tmp_path / 'absent.toml'}: cannot read")


# --- bench ----------------------------------------------------------------------------------

FAKE_SUITE = """
import json, os, signal, sys
print(json.dumps({"args": sys.argv[1:], "prefix": sys.prefix}), flush=True)
if "--die" in sys.argv:
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(sys.argv[-1]))
"""


@pytest.fixture
def fake_suite(tmp_path: Path) -> Path:
    """A directory whose run.py prints its arguments and exits with the last one."""
    directory = tmp_path / "suite"
    directory.mkdir()
    (directory / "run.py").write_text(FAKE_SUITE)
    return directory


def test_bench_passes_its_arguments_on_and_exits_with_the_suites_status(
    fake_suite: Path, tmp_path: Path
) -> None:
    result = run_script("bench", "--suite", str(fake_suite), "--quick", "--steps", "5", "3")
    assert result.status == 3, result.stderr
    assert json.loads(result.stdout) == {
        "args": ["--quick", "--steps", "5", "3"],
        "prefix": sys.prefix,  # the same interpreter: the same environment
    }


@pytest.mark.parametrize(
    ("args", "status", "passed"),
    [
        (["--", "--suite", "x", "-h", "0"], 0, ["--suite", "x", "-h", "0"]),
        (["--die", "0"], 128 + 15, ["--die", "0"]),
    ],
)
def test_bench_keeps_what_follows_the_separator_and_reports_a_signal(
    fake_suite: Path,
    run_main: Callable[..., Result],
    args: list[str],
    status: int,
    passed: list[str],
) -> None:
    result = run_main("bench", "--suite", str(fake_suite / "run.py"), *args)
    assert result.status == status, result.stderr
    assert json.loads(result.stdout)["args"] == passed


def make_checkout(root: Path, name: str) -> Path:
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "run.py").write_text(FAKE_SUITE)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    inside = root / "docs" / "deep"
    inside.mkdir(parents=True)
    return inside


def test_bench_finds_the_suite_of_the_checkout_around_the_current_directory(
    tmp_path: Path, run_main: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(make_checkout(tmp_path / "loadax", "loadax"))
    result = run_main("bench", "--quick", "0")
    assert result.status == 0, result.stderr
    assert json.loads(result.stdout)["args"] == ["--quick", "0"]


def test_bench_without_a_suite_exits_2(tmp_path: Path) -> None:
    inside = make_checkout(tmp_path / "other", "not-loadax")  # another project's benchmarks
    result = run_script("bench", "--quick", cwd=inside)
    assert result.status == 2
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"loadax bench: no benchmark suite: {inside} is not inside a loadax source checkout"
    )


def test_bench_names_a_suite_path_that_does_not_exist(
    tmp_path: Path, run_main: Callable[..., Result]
) -> None:
    result = run_main("bench", "--suite", str(tmp_path / "absent"))
    assert result.status == 2
    assert result.stderr == (
        f"loadax bench: --suite {tmp_path / 'absent'}: no such file (give a run.py or its "
        "directory)\n"
    )
