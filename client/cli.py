"""`loadax`: the client's command line. `loadax ping ADDR` checks a worker as a client would.

It imports the client and the core only, never the worker: a worker config is validated by the
worker's own command (`loadax-worker --config CONFIG --check`), and the benchmark suite runs from
a source checkout (`make bench`). `loadax check` and `loadax bench` say so.

Exit status: 0 success; 1 a worker that cannot be reached, is not serving or refuses; 2 a usage
error (bad arguments, or a command that moved).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import zmq.auth

import loadax
from loadax.client.security import ClientSecurity
from loadax.client.targets import GrpcTarget
from loadax.client.zmq_transport import ZmqTarget
from loadax.errors import WorkerError
from loadax.wire.v1 import worker_pb2 as wire

try:  # grpcio-health-checking comes with the worker extra; without it, ping skips health checks
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError:
    health_pb2 = health_pb2_grpc = None

EXIT_OK = 0
EXIT_FAILED = 1
"""A worker that cannot be reached, is not serving, or refuses a call."""
EXIT_USAGE = 2
"""Bad arguments, or a command that moved."""
DEFAULT_TIMEOUT_S = 5.0
MOVED = {
    "check": "validating a worker config is the worker's job: run "
    "`loadax-worker --config CONFIG --check [--json]`",
    "bench": "the benchmark suite is part of a loadax source checkout, not of an installed "
    "loadax: run `make bench` (or `python benchmarks/run.py [--quick]`) in the checkout",
}
"""Commands this CLI no longer has, and where each went."""
_SERVICE = wire.DESCRIPTOR.services_by_name["Worker"].full_name
R = TypeVar("R")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command the command line names; returns the exit status."""
    parser = _parser()
    # A moved command takes any arguments, to answer with where it went.
    args, extra = parser.parse_known_args(argv)
    if args.command in MOVED:
        return _usage_error(args.command, MOVED[args.command])
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _ping(args)
    except KeyboardInterrupt:
        print(f"loadax {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadax",
        description="Check loadax workers the way a RemoteDataLoader would (ping). A worker "
        "config is validated by `loadax-worker --config CONFIG --check [--json]`; the benchmark "
        "suite runs from a loadax source checkout (`make bench`). Exit status: 0 success; 1 a "
        "worker cannot be reached, is not serving or refuses; 2 a usage error.",
    )
    parser.add_argument("--version", action="version", version=f"loadax {loadax.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ping = commands.add_parser(
        "ping",
        help="check that a worker answers and serves its pipelines",
        description="Ask a worker for its pipelines (Info), check its gRPC health service "
        "(gRPC only) and handshake with each pipeline, as a RemoteDataLoader would. Prints the "
        "worker's loadax version, its pipelines (records, fingerprint), the result of each "
        "handshake and the round-trip latency (the fastest of the calls). Exit status 0 when "
        "the worker is SERVING and every handshake passes, 1 when it cannot be reached, is not "
        "serving or refuses a call, 2 on a usage error.",
    )
    ping.add_argument("address", metavar="ADDR", help="grpc://host:port or zmq://host:port")
    ping.add_argument(
        "--pipeline", metavar="NAME", help="handshake with this pipeline only (default: all)"
    )
    ping.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long each call may take (default {DEFAULT_TIMEOUT_S:g})",
    )
    ping.add_argument("--json", action="store_true", help="print one JSON object instead")
    security = ping.add_argument_group(
        "security", "as the worker's [server] settings require (see SECURITY.md)"
    )
    security.add_argument(
        "--token-file", type=Path, metavar="PATH", help="a file holding the workers' token"
    )
    security.add_argument(
        "--ca-cert",
        type=Path,
        metavar="PATH",
        help="gRPC over TLS: the CA (PEM) the worker's certificate must chain to",
    )
    security.add_argument(
        "--client-cert", type=Path, metavar="PATH", help="mutual TLS: this client's certificate"
    )
    security.add_argument(
        "--client-key", type=Path, metavar="PATH", help="mutual TLS: this client's private key"
    )
    security.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name the worker's certificate must have, when not the host of ADDR",
    )
    security.add_argument(
        "--curve-server-key",
        metavar="KEY",
        help="ZeroMQ over CURVE: the worker's Z85 public key (loadax-worker --check prints it)",
    )
    security.add_argument(
        "--curve-client-cert",
        type=Path,
        metavar="PATH",
        help="CURVE: this client's keys, a ZeroMQ certificate file with its public-key and "
        "secret-key (for workers with allowed_clients; default: a fresh keypair)",
    )

    for name in MOVED:  # no help: not listed; main() says where each went
        commands.add_parser(name, add_help=False)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _usage_error(command: str, message: str) -> int:
    print(f"loadax {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


# --- ping -----------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Pipeline:
    """A pipeline as `Info` lists it, and how its handshake went."""

    name: str
    fingerprint: str | None  # None: the worker does not serve it
    num_records: int | None
    handshake: str | None = None  # "ok", the refusal, or None when not tried (see --pipeline)
    round_trip_ms: float | None = None


@dataclasses.dataclass(slots=True)
class _PingReport:
    address: str
    health: str | None = None  # the Worker service's status; None over ZeroMQ or unchecked
    library_version: str | None = None
    round_trip_ms: float | None = None
    pipelines: list[_Pipeline] = dataclasses.field(default_factory=list)
    error: str | None = None  # why the ping ended before the handshakes

    @property
    def ok(self) -> bool:
        return self.error is None and all(
            pipeline.handshake in (None, "ok") for pipeline in self.pipelines
        )

    def problems(self) -> list[str]:
        """Every failure, in a sentence naming the address."""
        refused = [
            f"{self.address} refused the handshake of pipeline {pipeline.name!r}: "
            f"{pipeline.handshake}"
            for pipeline in self.pipelines
            if pipeline.handshake not in (None, "ok")
        ]
        return ([] if self.error is None else [self.error]) + refused

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **dataclasses.asdict(self)}


def _ping(args: argparse.Namespace) -> int:
    try:
        target = _open(args.address, _client_security(args))
    except ValueError as error:
        return _usage_error("ping", str(error))
    report = _PingReport(args.address)
    try:
        _probe(target, report, args.pipeline, args.timeout)
    finally:
        target.close()
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        _print_ping(report)
        for problem in report.problems():
            print(f"loadax ping: {problem}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FAILED


def _client_security(args: argparse.Namespace) -> ClientSecurity:
    """The security the flags ask for; a ValueError names the flag or field that is wrong."""
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as error:
            raise ValueError(
                f"--token-file: cannot read {args.token_file}: {error.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ValueError(f"--token-file: {args.token_file} is not text") from None
    keypair = None
    if args.curve_client_cert is not None:
        keypair = _curve_keypair(args.curve_client_cert)
    return ClientSecurity(
        ca_cert=args.ca_cert,
        client_cert=args.client_cert,
        client_key=args.client_key,
        tls_server_name=args.tls_server_name,
        token=token,
        curve_server_key=args.curve_server_key,
        curve_client_keypair=keypair,
    )


def _curve_keypair(path: Path) -> tuple[str, str]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"--curve-client-cert: {error}") from None
    if secret is None:
        raise ValueError(f"--curve-client-cert: {path} has no secret-key (use the *_secret file)")
    return public.decode("ascii", "replace"), secret.decode("ascii", "replace")


def _open(address: str, security: ClientSecurity) -> GrpcTarget | ZmqTarget:
    if address.startswith("grpc://"):
        return GrpcTarget(address, security)
    if address.startswith("zmq://"):
        return ZmqTarget(address, security)
    raise ValueError(f"ADDR must be grpc://host:port or zmq://host:port, got {address!r}")


def _probe(
    target: GrpcTarget | ZmqTarget, report: _PingReport, only: str | None, timeout: float
) -> None:
    """Fill `report`: health (gRPC), Info, then a handshake per pipeline (or with `only`)."""
    call = "the health check"
    try:
        if isinstance(target, GrpcTarget):
            report.health = _health(target, timeout)
            if report.health not in (None, "SERVING"):
                report.error = f"{report.address} is not serving: its health is {report.health}"
                with contextlib.suppress(WorkerError):  # a loadax worker's Info says why
                    reason = target.info(wire.InfoRequest(), timeout).status_reason
                    if reason:
                        report.error = f"{report.address} is not serving: {reason}"
                return
        call = "Info"
        info, info_ms = _timed(functools.partial(target.info, wire.InfoRequest(), timeout))
    except WorkerError as error:
        if error.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            report.error = f"cannot reach {report.address}: {error}"
        else:
            report.error = f"{report.address} refused {call}: {error}"
        return
    report.library_version = info.library_version
    if info.status == "NOT_SERVING":  # what ZeroMQ has of health
        report.health = info.status
        report.error = f"{report.address} is not serving: {info.status_reason}"
        return
    report.pipelines = [
        _Pipeline(served.name, served.fingerprint, served.num_records) for served in info.pipelines
    ]
    if only is not None and only not in {pipeline.name for pipeline in report.pipelines}:
        report.pipelines.append(_Pipeline(only, None, None))  # the worker will say what it has
    timings = [info_ms]
    for pipeline in report.pipelines:
        if only is not None and pipeline.name != only:
            continue
        request = wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline=pipeline.name, plan=wire.Plan(batch_size=1)
        )
        try:
            _, pipeline.round_trip_ms = _timed(
                functools.partial(target.handshake, request, timeout)
            )
        except WorkerError as error:
            pipeline.handshake = str(error)
        else:
            pipeline.handshake = "ok"
            timings.append(pipeline.round_trip_ms)
    report.round_trip_ms = min(timings)


def _health(target: GrpcTarget, timeout: float) -> str | None:
    """The Worker service's status on the standard gRPC health service (None: not checked).

    The call does not wait for a connection: an unreachable worker fails at once, with the cause.
    """
    if health_pb2 is None:
        print(
            "loadax ping: health not checked: it needs grpcio-health-checking "
            "(pip install 'loadax[worker]')",
            file=sys.stderr,
        )
        return None
    stub = health_pb2_grpc.HealthStub(target.channel)
    try:
        response = stub.Check(health_pb2.HealthCheckRequest(service=_SERVICE), timeout=timeout)
    except grpc.RpcError as error:
        code = error.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return "SERVICE_UNKNOWN"  # a gRPC server, not a loadax worker
        raise WorkerError(code.name, error.details() or "") from None
    status: str = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return status


def _timed(call: Callable[[], R]) -> tuple[R, float]:
    """`call()`'s result and how long it took, in milliseconds (to the microsecond)."""
    start = time.perf_counter()
    result = call()
    return result, round((time.perf_counter() - start) * 1e3, 3)


def _print_ping(report: _PingReport) -> None:
    if report.health is None and report.library_version is None:
        return  # nothing was learned: the error says why
    facts = [("worker", report.address)]
    if report.library_version is not None:
        facts.append(("version", f"loadax {report.library_version}"))
    if report.health is not None:
        facts.append(("health", report.health))
    if report.round_trip_ms is not None:
        facts.append(("round trip", _ms(report.round_trip_ms)))
    lines = _table(facts)
    if report.pipelines:
        rows = [("pipeline", "records", "fingerprint", "handshake")]
        for pipeline in report.pipelines:
            if pipeline.handshake is None:
                handshake = "-"
            elif pipeline.round_trip_ms is None:
                handshake = pipeline.handshake.partition(":")[0]  # the code: stderr has the rest
            else:
                handshake = f"ok ({_ms(pipeline.round_trip_ms)})"
            rows.append(
                (
                    pipeline.name,
                    "-" if pipeline.num_records is None else str(pipeline.num_records),
                    "-" if pipeline.fingerprint is None else pipeline.fingerprint[:12],
                    handshake,
                )
            )
        lines += ["", *_table(rows, right={1})]
    print("\n".join(lines))


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def _table(rows: Sequence[Sequence[str]], right: Container[int] = ()) -> list[str]:
    """`rows` as lines of aligned columns; the columns in `right` are right-aligned."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


if __name__ == "__main__":
    sys.exit(main())
