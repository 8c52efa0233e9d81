"""What `loadax ping` learns of a worker, as a client would: why it cannot be reached when a
socket tells (`diagnose`), its health (gRPC), its pipelines (Info), a handshake with each, the
round trip; and how that is printed."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Container, Sequence
from typing import Any, TypeVar

import grpc

import loadax
from loadax.client.security import ClientSecurity
from loadax.client.transports.diagnosis import diagnose
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import WorkerError
from loadax.wire.v1 import worker_pb2 as wire

try:  # grpcio-health-checking comes with the worker extra; without it, ping skips health checks
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError:
    health_pb2 = health_pb2_grpc = None

_SERVICE = wire.DESCRIPTOR.services_by_name["Worker"].full_name
R = TypeVar("R")


@dataclasses.dataclass(slots=True)
class Pipeline:
    """A pipeline as `Info` lists it, and how its handshake went."""

    name: str
    fingerprint: str | None  # None: the worker does not serve it
    num_records: int | None
    handshake: str | None = None  # "ok", the refusal, or None when not tried (see --pipeline)
    round_trip_ms: float | None = None


@dataclasses.dataclass(slots=True)
class PingReport:
    """What a ping found of the worker at `address`."""

    address: str
    health: str | None = None  # the Worker service's status; None over ZeroMQ or unchecked
    library_version: str | None = None
    round_trip_ms: float | None = None
    pipelines: list[Pipeline] = dataclasses.field(default_factory=list)
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


def probe(
    target: GrpcTransport | ZmqTransport,
    report: PingReport,
    only: str | None,
    timeout: float,
    security: ClientSecurity,
) -> None:
    """Fill `report`: why the worker cannot be reached if a socket tells (a name that does not
    resolve, a refused connection, a port of another transport, TLS on one side only: at once,
    not at the timeout), else health (gRPC), Info, then a handshake per pipeline (or `only`)."""
    diagnosis = diagnose(report.address, timeout, security)
    if diagnosis is not None:
        report.error = f"cannot reach {report.address}: {diagnosis}"
        return
    call = "the health check"
    try:
        if isinstance(target, GrpcTransport):
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
        Pipeline(served.name, served.fingerprint, served.num_records) for served in info.pipelines
    ]
    if only is not None and only not in {pipeline.name for pipeline in report.pipelines}:
        report.pipelines.append(Pipeline(only, None, None))  # the worker will say what it has
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


def _health(target: GrpcTransport, timeout: float) -> str | None:
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


def print_report(report: PingReport) -> None:
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
