"""What a valid worker config serves, as `loadax-worker --check` reports it, and the problems of
its pipelines that would fail every request or break checkpoints: a probe batch that fails, and
a pipeline whose batches are not a function of their step (two builds probe differently).

Needs only the worker's core (no gRPC server extras): a config checks where it cannot be served.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from loadax.execution.pipeline import Pipeline
from loadax.identity.fingerprint import SHORT_FINGERPRINT, pipeline_fingerprint, probe_frames
from loadax.iterators.determinism import HINT
from loadax.server.config import WorkerConfig, build_pipelines
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
    """A config's listen addresses, its pipelines, its security settings, the worker's memory
    budget and the problems of its pipelines (none: it is fit to serve)."""

    config: str
    grpc: str | None
    zmq: str | None
    metrics: str | None
    pipelines: tuple[CheckedPipeline, ...]
    security: tuple[str, ...]
    memory_budget_bytes: int
    problems: tuple[str, ...]

    def lines(self) -> list[str]:
        """One line per pipeline and per security setting."""
        return [pipeline.line() for pipeline in self.pipelines] + list(self.security)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (args that JSON cannot hold, such as TOML dates, become strings)."""
        report: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(self), default=str))
        return report


def check_report(config: WorkerConfig, worker: Worker) -> CheckReport:
    """What `config` serves, once `worker` (built from it) has built every pipeline; each
    pipeline is built and probed once more for its problems."""
    served = {pipeline.name: pipeline for pipeline in worker.info(wire.InfoRequest()).pipelines}
    rebuilt = build_pipelines(config)
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
        memory_budget_bytes=worker.memory_budget.limit,
        problems=tuple(
            problem
            for name, pipeline in rebuilt.items()
            if (problem := pipeline_problem(name, pipeline, served[name].fingerprint))
        ),
    )


def pipeline_problem(name: str, pipeline: Pipeline[Any, Any], served: str) -> str | None:
    """Why pipeline `name`, built anew, is unfit to serve: its probe batch fails, or its
    fingerprint is not `served`, the one the worker computed from another build and probe."""
    try:
        probe_frames(pipeline)
    except Exception as error:
        return (
            f"pipeline {name!r}: its probe batch (the first rows of step 0, or window 0 of a "
            f"stream) fails, and so would every request: {error!r}"
        )
    fingerprint = pipeline_fingerprint(pipeline)
    if fingerprint != served:
        one, other = served[:SHORT_FINGERPRINT], fingerprint[:SHORT_FINGERPRINT]
        return (
            f"pipeline {name!r}: the pipeline is not deterministic: two builds and probes of it "
            f"give fingerprints {one} and {other} ({HINT})"
        )
    return None


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
