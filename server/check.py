"""What a valid worker config serves, as `loadax-worker --check` reports it.

Needs only the worker's core (no gRPC server extras): a config checks where it cannot be served.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from loadax.server.config import WorkerConfig
from loadax.server.worker import Worker
from loadax.wire.v1 import worker_pb2 as wire


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedPipeline:
    """A pipeline as the worker built it from its factory."""

    name: str
    factory: str
    args: Mapping[str, Any]
    num_records: int
    fingerprint: str

    def line(self) -> str:
        args = json.dumps(dict(self.args), default=repr)
        return (
            f"{self.name}: {self.factory}(**{args}) -> {self.num_records} records, "
            f"fingerprint {self.fingerprint[:12]}"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class CheckReport:
    """A config's listen addresses, its pipelines and its security settings."""

    config: str
    grpc: str | None
    zmq: str | None
    metrics: str | None
    pipelines: tuple[CheckedPipeline, ...]
    security: tuple[str, ...]

    def lines(self) -> list[str]:
        """One line per pipeline and per security setting."""
        return [pipeline.line() for pipeline in self.pipelines] + list(self.security)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (args that JSON cannot hold, such as TOML dates, become strings)."""
        report: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(self), default=str))
        return report


def check_report(config: WorkerConfig, worker: Worker) -> CheckReport:
    """What `config` serves, once `worker` (built from it) has built every pipeline."""
    served = {pipeline.name: pipeline for pipeline in worker.info(wire.InfoRequest()).pipelines}
    return CheckReport(
        config=config.source,
        grpc=config.grpc,
        zmq=config.zmq,
        metrics=config.metrics,
        pipelines=tuple(
            CheckedPipeline(
                name=pipeline.name,
                factory=pipeline.factory,
                args=dict(pipeline.args),
                num_records=served[pipeline.name].num_records,
                fingerprint=served[pipeline.name].fingerprint,
            )
            for pipeline in config.pipelines
        ),
        security=tuple(security_lines(config)),
    )


def security_lines(config: WorkerConfig) -> list[str]:
    """One line per security setting (nothing when there are none)."""
    lines = []
    if config.tls is not None:
        mutual = "mutual: clients need a certificate signed by client_ca"
        lines.append(f"grpc: TLS ({mutual if config.tls.client_ca else 'server certificate'})")
    if config.curve is not None:
        allowed = config.curve.allowed_clients
        admits = "any client" if allowed is None else f"{len(allowed)} allowed client keys"
        lines.append(f"zmq: CURVE ({admits}), public key {config.curve.public_key.decode()}")
    if config.token is not None:
        lines.append("token: required on every request")
    return lines
