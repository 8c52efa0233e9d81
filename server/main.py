"""`loadax-worker`: serve the pipelines of a TOML config over gRPC and/or ZeroMQ until signalled.

Stdout carries one JSON line when ready (`{"event": "ready", ...}`) and one when stopped; logs go
to stderr, as text or (`[server] log_format = "json"`, `--log-format json`) as JSON lines.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from loadax.execution.autotune import usable_cores
from loadax.execution.heap import keep_freed_memory, loading_arenas
from loadax.logfields import fields, of_record
from loadax.server.check import check_report, security_lines
from loadax.server.config import LOG_FORMATS, WorkerConfig, load_config
from loadax.server.config_checks import ConfigError
from loadax.server.grpc_server import GrpcServer
from loadax.server.metrics import WorkerMetrics
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer

log = logging.getLogger("loadax.server")

EXIT_CONFIG = 2
"""The exit status for a config that cannot be used (and for bad command-line arguments)."""
EXIT_START = 1
"""The exit status when the worker cannot listen (e.g. the port is taken)."""
_STOPPED = 0
"""What the shutdown thread writes to wake the main thread (signal numbers are never 0)."""


class _Server(Protocol):
    def start(self) -> str: ...

    def stop(self, grace: float) -> None: ...


def main(argv: Sequence[str] | None = None) -> None:
    """Run the worker (or, with --check, validate its config) as the command line says."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.json and not args.check:
        parser.error("--json goes with --check")
    logs = logging.StreamHandler(sys.stderr)
    logging.basicConfig(level=args.log_level, handlers=[logs])
    _format_logs(logs, args.log_format or "text")
    try:
        config = load_config(
            args.config,
            grpc=args.grpc,
            zmq=args.zmq,
            metrics=args.metrics,
            processes=args.processes,
        )
        _format_logs(logs, args.log_format or config.log_format)
        # This process serves batches; see loadax.execution.heap.
        keep_freed_memory(loading_arenas(config.threads, usable_cores()))
        worker = Worker.from_config(config)
    except ConfigError as error:
        if args.json:
            print(json.dumps({"valid": False, "config": args.config, "error": str(error)}))
        elif isinstance(logs.formatter, JsonLines) and not args.check:
            # A collector reading JSON lines gets why the worker exits.
            log.error("%s", error, extra=fields(event="config_error", error=error))
        else:
            print(f"loadax-worker: {error}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    if args.check:
        try:
            report = check_report(config, worker)
        finally:
            worker.close()
        if args.json:
            print(json.dumps({"valid": not report.problems, **report.to_json()}))
        else:
            print("\n".join(report.lines()))
            for problem in report.problems:
                print(f"loadax-worker: {config.source}: {problem}", file=sys.stderr)
        if report.problems:
            raise SystemExit(EXIT_CONFIG)
        return
    _serve(config, worker, args.grace)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadax-worker",
        description=(
            "Serve loadax pipelines to RemoteDataLoaders over gRPC and/or ZeroMQ. When ready, "
            'prints one JSON line {"event": "ready", "grpc": ..., "zmq": ..., "metrics": ..., '
            '"pipelines": [...], "memory_budget_bytes": ...} to stdout. On SIGTERM or SIGINT it '
            "reports NOT_SERVING, refuses new requests, finishes those in flight, prints "
            '{"event": "stopped"} and exits 0; a '
            "second signal exits at once. SIGUSR1 dumps every thread's stack to stderr. Exit "
            "status 2: the config or the arguments are invalid; 1: the worker cannot listen."
        ),
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="PATH",
        help="the worker's TOML config: [server] addresses and limits, [pipelines.NAME] factories",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config (parse it, read the TLS, CURVE and token files, import and "
        "call every factory), print one line per pipeline and per security setting and exit 0; "
        "exit 2 on an error, or when a pipeline's probe batch fails or two probes of it differ "
        "(it is not deterministic)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='with --check: print one JSON object instead, {"valid": true, "config": ..., '
        '"grpc": ..., "zmq": ..., "metrics": ..., "pipelines": [...], "security": [...]}, or '
        '{"valid": false, "config": ..., "error": ...} with exit status 2',
    )
    parser.add_argument(
        "--grpc",
        metavar="ADDRESS",
        help="gRPC listen address host:port, replacing [server].grpc (port 0: any free port)",
    )
    parser.add_argument(
        "--zmq",
        metavar="ENDPOINT",
        help="ZeroMQ endpoint tcp://host:port, replacing [server].zmq (port 0: any free port)",
    )
    parser.add_argument(
        "--metrics",
        metavar="ADDRESS",
        help="serve Prometheus metrics at http://ADDRESS/metrics, ADDRESS being host:port, "
        "replacing [server].metrics (port 0: any free port)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="load each pipeline's batches in N child processes, replacing [server].processes "
        "(0: on threads); a record that crashes or hangs then costs a child, not the worker",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long requests in flight may take to finish (default 30)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help='how logs are written to stderr, replacing [server].log_format: "text" (the '
        'default) or "json", one object a line: {"time": ..., "level": ..., "logger": ..., '
        '"message": ...}, and "traceback" when an exception is logged',
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="the level of the logs written to stderr (default INFO)",
    )
    return parser


def _warn_about_plaintext(config: WorkerConfig) -> None:
    if config.token is None:
        return
    for name, address, secured in (
        ("gRPC", config.grpc, config.tls is not None),
        ("ZeroMQ", config.zmq, config.curve is not None),
    ):
        if address is not None and not secured:
            log.warning(
                "%s on %s is not encrypted: the token crosses the network in the clear",
                name,
                address,
            )


def _serve(config: WorkerConfig, worker: Worker, grace: float) -> None:
    faulthandler.register(signal.SIGUSR1)
    signals = _Signals()
    servers: list[_Server] = []
    bound: dict[str, str | None] = {"grpc": None, "zmq": None, "metrics": None}
    metrics = WorkerMetrics(worker.memory_budget, worker.share_cache)
    limits = {
        # Requests loaded at once: enough to keep every child busy.
        "threads": max(config.threads, config.processes),
        "max_in_flight_per_client": config.max_in_flight_per_client,
    }
    _warn_about_plaintext(config)
    try:
        if config.metrics is not None:
            bound["metrics"] = metrics.start_exporter(config.metrics)
        if config.grpc is not None:
            servers.append(
                GrpcServer(
                    worker,
                    config.grpc,
                    tls=config.tls,
                    token=config.token,
                    metrics=metrics,
                    data_port=config.grpc_data_port,
                    **limits,
                )
            )
            bound["grpc"] = servers[-1].start()
        if config.zmq is not None:
            servers.append(
                ZmqServer(
                    worker,
                    config.zmq,
                    curve=config.curve,
                    token=config.token,
                    metrics=metrics,
                    data_port=config.zmq_data_port,
                    **limits,
                )
            )
            bound["zmq"] = servers[-1].start()
    except Exception as error:
        log.error("cannot start: %s", error, extra=fields(event="start_failed", error=error))
        _shut_down(servers, worker, metrics, 0.0)
        raise SystemExit(EXIT_START) from None
    names = [pipeline.name for pipeline in config.pipelines]
    budget = worker.memory_budget.limit
    # The worker's addresses as clients name them.
    addresses = [
        f"{scheme}://{address.removeprefix('tcp://')}"
        for scheme, address in (("grpc", bound["grpc"]), ("zmq", bound["zmq"]))
        if address is not None
    ]
    log.info(
        "serving %s on gRPC %s, ZeroMQ %s; metrics on %s; memory budget %d MiB%s",
        names,
        bound["grpc"],
        bound["zmq"],
        bound["metrics"],
        budget >> 20,
        "" if config.memory_budget_bytes else " (the default: a share of the machine's memory)",
        extra=fields(event="ready", worker=addresses),
    )
    for line in security_lines(config):
        log.info("security: %s", line)
    _emit({"event": "ready", **bound, "pipelines": names, "memory_budget_bytes": budget})

    number = signals.wait()
    stopping = time.monotonic()
    log.info(
        "%s received: finishing the requests in flight (up to %g s)",
        signal.Signals(number).name,
        grace,
        extra=fields(event="stopping", worker=addresses),
    )
    stopper = threading.Thread(
        target=_shut_down,
        args=(servers, worker, metrics, grace, signals.wake),
        name="loadax-stop",
    )
    stopper.start()
    number = signals.wait()
    if number != _STOPPED:
        log.warning("%s again: exiting without waiting", signal.Signals(number).name)
        os._exit(1)
    stopper.join()
    log.info(
        "stopped",
        extra=fields(event="stopped", worker=addresses, duration_s=time.monotonic() - stopping),
    )
    _emit({"event": "stopped"})


def _shut_down(
    servers: Sequence[_Server],
    worker: Worker,
    metrics: WorkerMetrics,
    grace: float,
    done: Callable[[], None] = lambda: None,
) -> None:
    """Stop every server at once (each waits for its calls in flight), then the worker, then
    the metrics exporter (scrapes see the requests drain)."""
    try:
        stoppers = [
            threading.Thread(target=server.stop, args=(grace,), name="loadax-stop-server")
            for server in servers
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        worker.close()
        metrics.stop_exporter()
    finally:
        done()


def _format_logs(handler: logging.Handler, log_format: str) -> None:
    if log_format == "json":
        handler.setFormatter(JsonLines())
        logging.captureWarnings(True)  # the factories' warnings too, as log records
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))


class JsonLines(logging.Formatter):
    """A log record as one line of JSON, for log collectors: its time (UTC, ISO 8601), level,
    logger and message, the facts it carries as fields (`loadax.logfields`: event, pipeline,
    step, client, status, ...; no other attribute of a record), and the traceback of an
    exception logged with it."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **of_record(record),
        }
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line)


class _Signals:
    """SIGTERM and SIGINT, waited for by the main thread whichever thread they land on.

    The C-level handler writes the signal's number to a wakeup pipe, so the main thread wakes
    even when the kernel delivers the signal to one of the server's threads.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda number, frame: None)

    def wait(self) -> int:
        """Block until a signal arrives (its number) or `wake()` is called (0)."""
        return os.read(self._read, 1)[0]

    def wake(self) -> None:
        os.write(self._write, bytes([_STOPPED]))


def _emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


if __name__ == "__main__":
    main()
