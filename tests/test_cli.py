"""The `loadax` command line: ping real workers over gRPC and ZeroMQ; moved commands say where.

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
from loadax.client import cli, ping
from loadax.server.grpc_server import SERVICE

SCRIPT = Path(sys.executable).with_name("loadax")
WORKER_SCRIPT = SCRIPT.with_name("loadax-worker")
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
    server = grpc.server(ThreadPoolExecutor(2), options=[("grpc.so_reuseport", 0)])  # its own port
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


def test_ping_json_over_zeromq_lists_what_the_worker_check_reports(
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
    config = write_config(tmp_path, SERVED, zmq=True)
    checked = subprocess.run(
        [str(WORKER_SCRIPT), "--config", str(config), "--check", "--json"],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=120,
        check=True,
    )
    assert [(p["name"], p["fingerprint"]) for p in pipelines] == [
        (p["name"], p["fingerprint"]) for p in json.loads(checked.stdout)["pipelines"]
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
    assert result.stderr == f"loadax ping: cannot reach {address}: connection refused\n"


def test_an_unreachable_zeromq_worker_fails_at_once_in_json(
    closed_port: int, run_main: Callable[..., Result]
) -> None:
    address = f"zmq://127.0.0.1:{closed_port}"
    result = run_main("ping", address, "--timeout", "60", "--json")
    assert result.status == 1
    assert result.json() == {
        "ok": False,
        "address": address,
        "health": None,
        "library_version": None,
        "round_trip_ms": None,
        "pipelines": [],
        "error": f"cannot reach {address}: connection refused",
    }


def test_a_zeromq_worker_that_accepts_but_never_answers_fails_at_the_timeout(
    run_main: Callable[..., Result],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; no one speaks
        address = f"zmq://127.0.0.1:{silent.getsockname()[1]}"
        result = run_main("ping", address, "--timeout", "0.3", "--json")
    assert result.status == 1
    assert result.json()["error"] == (
        f"cannot reach {address}: accepts connections but says nothing within 0.3 s"
    )


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
    monkeypatch.setattr(ping, "health_pb2", None)
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


# --- moved commands -------------------------------------------------------------------------


WORKER_CHECK = "`loadax-worker --config CONFIG --check [--json]`"


@pytest.mark.parametrize(
    ("args", "pointer"),
    [
        (["check", "worker.toml", "--json"], f"run {WORKER_CHECK}"),
        (["check", "--help"], f"run {WORKER_CHECK}"),
        (["bench", "--quick"], "run `make bench` (or `python benchmarks/run.py [--quick]`)"),
    ],
)
def test_a_moved_command_exits_2_saying_where_it_went(
    run_main: Callable[..., Result], args: list[str], pointer: str
) -> None:
    result = run_main(*args)
    assert result.status == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"loadax {args[0]}: ")
    assert pointer in result.stderr


def test_help_lists_ping_only_and_points_to_the_worker_check() -> None:
    result = run_script("--help")
    assert result.status == 0, result.stderr
    listed = result.stdout.partition("  COMMAND\n")[2].partition("\n\n")[0]
    assert [line.split()[0] for line in listed.splitlines()] == ["ping"]
    assert WORKER_CHECK in " ".join(result.stdout.split())
