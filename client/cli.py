"""`loadax`: the client's command line. `loadax ping ADDR` checks a worker as a client would.

It imports the client and the core only, never the worker: a worker config is validated by the
worker's own command (`loadax-worker --config CONFIG --check`), and the benchmark suite runs from
a source checkout (`make bench`). `loadax check` and `loadax bench` say so.

Exit status: 0 success; 1 a worker that cannot be reached, is not serving or refuses; 2 a usage
error (bad arguments, or a command that moved).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import zmq.auth

import loadax
from loadax.client.ping import PingReport, print_report, probe
from loadax.client.security import ClientSecurity
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport

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
        "handshake and the round-trip latency (the fastest of the calls). A worker that cannot "
        "be reached is told at once from a plain socket: a name that does not resolve, a refused "
        "connection, a port of the other transport, TLS on one side only. Exit status 0 when "
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


def _ping(args: argparse.Namespace) -> int:
    try:
        security = _client_security(args)
        target = _open(args.address, security)
    except ValueError as error:
        return _usage_error("ping", str(error))
    report = PingReport(args.address)
    try:
        probe(target, report, args.pipeline, args.timeout, security)
    finally:
        target.close()
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print_report(report)
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


def _open(address: str, security: ClientSecurity) -> GrpcTransport | ZmqTransport:
    if address.startswith("grpc://"):
        return GrpcTransport(address, security)
    if address.startswith("zmq://"):
        return ZmqTransport(address, security)
    raise ValueError(f"ADDR must be grpc://host:port or zmq://host:port, got {address!r}")


if __name__ == "__main__":
    sys.exit(main())
