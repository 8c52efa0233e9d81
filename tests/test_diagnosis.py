"""Why a target does not answer, from a plain socket (`diagnose`), and `loadax ping` saying it at
once: against real workers of both transports (and TLS, and a metrics port), a closed port, a
silent one, one that hangs up, and a name that does not resolve."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pipelines import SERVED
from test_security import copy_secrets, make_pki
from workers import WorkerProcess, worker_with_settings

from loadax.client import cli
from loadax.client.security import ClientSecurity
from loadax.client.transports.diagnosis import GREETING_S, Diagnosis, diagnose

TIMEOUT = 5.0  # what diagnose may take; every answer here takes milliseconds, or GREETING_S
UNRESOLVABLE = "no-such-host.invalid"  # .invalid never resolves (RFC 2606)


@dataclasses.dataclass(frozen=True)
class Ping:
    status: int
    stderr: str
    seconds: float


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker serving gRPC and ZeroMQ, each on its port, and metrics (HTTP/1) on a third."""
    directory = tmp_path_factory.mktemp("worker")
    with worker_with_settings(directory, 'metrics = "127.0.0.1:0"', SERVED, zmq=True) as served:
        yield served


@pytest.fixture(scope="module")
def tls_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerProcess, Path]]:
    """A worker serving gRPC over TLS, and the CA its certificate chains to."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    directory = tmp_path_factory.mktemp("tls")
    copy_secrets(pki, directory)
    settings = '[server.tls]\ncert = "server.pem"\nkey = "server.key"'
    with worker_with_settings(directory, settings, SERVED) as served:
        yield served, pki.ca


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel does) and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def hanging_up_port() -> Iterator[int]:
    """A loopback port whose server closes every connection at once, without a word."""
    with socket.create_server(("127.0.0.1", 0)) as server:

        def hang_up() -> None:
            while True:
                try:
                    connection, _ = server.accept()
                except OSError:  # the server closed: the test is over
                    return
                connection.close()

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        yield server.getsockname()[1]
        server.shutdown(socket.SHUT_RDWR)
    thread.join(timeout=10)


@pytest.fixture
def ping(capfd: pytest.CaptureFixture[str]) -> Callable[..., Ping]:
    """`loadax ping ARGS` in this process: its exit status, what it printed on stderr, and how
    long it took."""

    def run(*args: str) -> Ping:
        started = time.monotonic()
        status = cli.main(["ping", *args])
        seconds = time.monotonic() - started
        return Ping(status, capfd.readouterr().err, seconds)

    return run


def host_port(address: str) -> str:
    return address.partition("://")[2]


def timed(spec: str, security: ClientSecurity | None = None) -> tuple[Diagnosis | None, float]:
    started = time.monotonic()
    found = diagnose(spec, TIMEOUT, security)
    return found, time.monotonic() - started


# --- loadax ping ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "other", "speaks", "not_"),
    [("grpc", "zmq", "gRPC", "ZeroMQ"), ("zmq", "grpc", "ZeroMQ", "gRPC")],
)
def test_ping_of_a_port_of_the_other_transport_names_its_scheme_at_once(
    worker: WorkerProcess,
    ping: Callable[..., Ping],
    transport: str,
    other: str,
    speaks: str,
    not_: str,
) -> None:
    where = host_port(worker.address(transport))
    address = f"{other}://{where}"
    result = ping(address, "--timeout", "10")  # the wait before, for one of them
    assert result.status == cli.EXIT_FAILED
    assert result.stderr == (
        f"loadax ping: cannot reach {address}: this port speaks {speaks}, not {not_}: use "
        f"{transport}://{where}\n"
    )
    assert result.seconds < 5.0


@pytest.mark.parametrize("scheme", ["grpc", "zmq"])
def test_ping_of_a_closed_port_says_refused_at_once(
    closed_port: int, ping: Callable[..., Ping], scheme: str
) -> None:
    address = f"{scheme}://127.0.0.1:{closed_port}"
    result = ping(address, "--timeout", "10")
    assert (result.status, result.stderr) == (
        cli.EXIT_FAILED,
        f"loadax ping: cannot reach {address}: connection refused\n",
    )
    assert result.seconds < 5.0


@pytest.mark.parametrize("scheme", ["grpc", "zmq"])
def test_ping_of_a_name_that_does_not_resolve_says_so_at_once(
    ping: Callable[..., Ping], scheme: str
) -> None:
    address = f"{scheme}://{UNRESOLVABLE}:50051"
    result = ping(address, "--timeout", "10")
    assert result.status == cli.EXIT_FAILED
    assert result.stderr.startswith(
        f"loadax ping: cannot reach {address}: the name {UNRESOLVABLE!r} does not resolve ("
    )
    assert result.seconds < 5.0


# --- diagnose -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_port_of_the_scheme_it_speaks_has_nothing_to_diagnose(
    worker: WorkerProcess, transport: str
) -> None:
    assert timed(worker.address(transport))[0] is None


@pytest.mark.parametrize(
    ("transport", "other", "speaks", "not_"),
    [("grpc", "zmq", "gRPC", "ZeroMQ"), ("zmq", "grpc", "ZeroMQ", "gRPC")],
)
def test_a_port_of_the_other_transport_is_final_and_names_the_right_scheme(
    worker: WorkerProcess, transport: str, other: str, speaks: str, not_: str
) -> None:
    where = host_port(worker.address(transport))
    found, seconds = timed(f"{other}://{where}")
    assert found == Diagnosis(
        "wrong_protocol", f"this port speaks {speaks}, not {not_}: use {transport}://{where}", True
    )
    assert seconds < 1.0  # the worker speaks first: no wait for a greeting


@pytest.mark.parametrize(("scheme", "not_"), [("grpc", "gRPC"), ("zmq", "ZeroMQ")])
def test_a_metrics_port_speaks_http(worker: WorkerProcess, scheme: str, not_: str) -> None:
    assert worker.metrics is not None
    found, _ = timed(f"{scheme}://{worker.metrics}")
    assert found == Diagnosis(
        "wrong_protocol", f"this port speaks HTTP, not {not_} (a metrics port?)", True
    )


def test_tls_on_one_side_only_is_final_and_says_which(
    worker: WorkerProcess, tls_worker: tuple[WorkerProcess, Path]
) -> None:
    served, ca = tls_worker
    tls = ClientSecurity(ca_cert=ca)
    assert timed(served.address("grpc"), tls)[0] is None
    assert timed(served.address("grpc"))[0] == Diagnosis(
        "wrong_protocol",
        "this port speaks TLS: set ca_cert (the CA of the worker's certificate)",
        True,
    )
    where = host_port(served.address("grpc"))
    assert timed(f"zmq://{where}")[0] == Diagnosis(
        "wrong_protocol",
        f"this port speaks TLS (gRPC with TLS?), not ZeroMQ: use grpc://{where} with ca_cert",
        True,
    )
    assert timed(worker.address("grpc"), tls)[0] == Diagnosis(
        "wrong_protocol",
        "this port speaks gRPC without TLS, but this client has ca_cert set (TLS)",
        True,
    )


@pytest.mark.parametrize("scheme", ["grpc", "zmq"])
def test_a_closed_port_is_refused_for_good(closed_port: int, scheme: str) -> None:
    found, seconds = timed(f"{scheme}://127.0.0.1:{closed_port}")
    assert found == Diagnosis("refused", "connection refused", final=True)
    assert seconds < 1.0


def test_a_name_that_does_not_resolve_is_final() -> None:
    found, _ = timed(f"grpc://{UNRESOLVABLE}:50051")
    assert found is not None
    assert (found.kind, found.final) == ("unresolved", True)
    assert found.cause.startswith(f"the name {UNRESOLVABLE!r} does not resolve (")


def test_a_port_that_accepts_and_says_nothing_may_yet_answer(silent_port: int) -> None:
    started = time.monotonic()
    found = diagnose(f"zmq://127.0.0.1:{silent_port}", 0.5)
    seconds = time.monotonic() - started
    assert found == Diagnosis(
        "silent", "accepts connections but says nothing within 0.5 s", final=False
    )
    assert 0.5 <= seconds < 2.5  # it waited its timeout, no longer


def test_a_port_that_hangs_up_may_yet_answer(hanging_up_port: int) -> None:
    found, seconds = timed(f"grpc://127.0.0.1:{hanging_up_port}")
    assert found == Diagnosis("silent", "closes connections without a word", final=False)
    assert seconds < GREETING_S + 1.0


def test_a_worker_object_has_nothing_to_diagnose() -> None:
    assert diagnose(object(), TIMEOUT) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("http://127.0.0.1:1", "must start with grpc:// or zmq://"),
        ("grpc://127.0.0.1", "must be grpc://host:port, with a port 1-65535"),
        ("zmq://127.0.0.1:http", "must be zmq://host:port, with a port 1-65535"),
        ("grpc://:50051", "must be grpc://host:port, with a port 1-65535"),
    ],
)
def test_an_address_that_is_not_one_is_a_value_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        diagnose(spec, TIMEOUT)
