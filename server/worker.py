"""The worker's core, independent of transport: handshakes and batch requests in, replies out.

It holds no per-client state: a batch is a pure function of (pipeline, plan, step, rows), so any
worker can serve any request. Every bad request is a `WorkerError` naming what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import loadax
from loadax.codec import encode
from loadax.dataset import dataset_length
from loadax.errors import RecordError, WorkerError
from loadax.local_sources import ThreadedSource
from loadax.pipeline import Pipeline
from loadax.server.config import WorkerConfig, build_pipelines, load_config
from loadax.wire.plans import compatible_versions, plan_from_wire
from loadax.wire.v1 import worker_pb2 as wire


def fingerprint(name: str, pipeline: Pipeline[Any, Any], origin: Mapping[str, Any]) -> str:
    """Identifies what a pipeline serves: its name, length, batcher and where it came from."""
    identity = {
        "name": name,
        "num_records": dataset_length(pipeline.dataset),
        "dataset": type(pipeline.dataset).__qualname__,
        "batcher": repr(pipeline.batcher),
        "origin": origin,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=repr).encode()).hexdigest()


class Worker:
    """Serves batches of named pipelines; `threads` read the records of each batch."""

    def __init__(
        self,
        pipelines: Mapping[str, Pipeline[Any, Any]],
        *,
        threads: int = 4,
        origins: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if not pipelines:
            raise ValueError("a worker needs at least one pipeline")
        for name, pipeline in pipelines.items():
            if not isinstance(pipeline, Pipeline):
                raise ValueError(
                    f"pipeline {name!r} must be a loadax.Pipeline, got {type(pipeline).__name__}"
                )
        self._pipelines = dict(pipelines)
        self._sources = {
            name: ThreadedSource(pipeline, threads) for name, pipeline in pipelines.items()
        }
        self._fingerprints = {
            name: fingerprint(name, pipeline, (origins or {}).get(name, {}))
            for name, pipeline in pipelines.items()
        }

    @classmethod
    def from_config(cls, config: WorkerConfig | str | Path) -> Worker:
        """The worker a config (or the config file at a path) describes.

        Fingerprints cover each pipeline's factory and args.
        """
        if not isinstance(config, WorkerConfig):
            config = load_config(config)
        origins = {
            pipeline.name: {"factory": pipeline.factory, "args": dict(pipeline.args)}
            for pipeline in config.pipelines
        }
        return cls(build_pipelines(config), threads=config.threads, origins=origins)

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        if not compatible_versions(request.library_version, loadax.__version__):
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"client loadax {request.library_version!r} cannot use worker loadax "
                f"{loadax.__version__!r}: major and minor versions must match",
            )
        pipeline = self._pipeline(request.pipeline)
        num_records = dataset_length(pipeline.dataset)
        plan_from_wire(request.plan, num_records)
        return wire.HandshakeResponse(
            library_version=loadax.__version__,
            pipeline=request.pipeline,
            fingerprint=self._fingerprints[request.pipeline],
            num_records=num_records,
        )

    def load_batch(self, request: wire.BatchRequest) -> wire.BatchResponse:
        pipeline = self._pipeline(request.pipeline)
        expected = self._fingerprints[request.pipeline]
        if request.fingerprint != expected:
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"pipeline {request.pipeline!r} has fingerprint {expected[:12]} on this worker, "
                f"the client expects {request.fingerprint[:12] or 'none'}",
            )
        num_records = dataset_length(pipeline.dataset)
        if request.plan.num_records != num_records:
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"the plan has {request.plan.num_records} records, pipeline "
                f"{request.pipeline!r} has {num_records}",
            )
        plan = plan_from_wire(request.plan)
        step = request.step
        total = plan.num_steps
        if total is not None and step >= total:
            raise WorkerError("OUT_OF_RANGE", f"step {step} is beyond the plan's {total} steps")
        rows = self._rows(request, plan.batch_length(step))
        try:
            batch = self._sources[request.pipeline].submit(plan, step, rows).result()
        except RecordError as error:
            cause = error.__cause__ or error
            text = "".join(traceback.format_exception(cause))
            raise WorkerError("DATA_LOSS", f"{error}\n{text}") from error
        except Exception as error:
            text = "".join(traceback.format_exception(error))
            raise WorkerError("INTERNAL", f"step {step} failed: {error!r}\n{text}") from error
        return wire.BatchResponse(step=step, payload=encode(batch))

    def info(self, request: wire.InfoRequest) -> wire.InfoResponse:
        del request  # nothing to ask
        return wire.InfoResponse(
            library_version=loadax.__version__,
            pipelines=[
                wire.PipelineInfo(
                    name=name,
                    fingerprint=self._fingerprints[name],
                    num_records=dataset_length(pipeline.dataset),
                )
                for name, pipeline in self._pipelines.items()
            ],
        )

    def close(self) -> None:
        """Release the record-loading threads (after in-flight work finishes)."""
        for source in self._sources.values():
            source.release(wait=True)

    def _pipeline(self, name: str) -> Pipeline[Any, Any]:
        if name not in self._pipelines:
            raise WorkerError(
                "NOT_FOUND",
                f"unknown pipeline {name!r}: this worker serves {sorted(self._pipelines)}",
            )
        return self._pipelines[name]

    @staticmethod
    def _rows(request: wire.BatchRequest, batch_length: int) -> np.ndarray[Any, Any] | None:
        if not request.rows:
            return None
        # Checked as Python ints: values of 2**63 and more would wrap in int64.
        if max(request.rows) >= batch_length:
            raise WorkerError(
                "INVALID_ARGUMENT",
                f"rows must lie within the batch of {batch_length} rows, got {max(request.rows)}",
            )
        rows = np.asarray(request.rows, dtype=np.int64)
        if np.any(np.diff(rows) <= 0):
            raise WorkerError(
                "INVALID_ARGUMENT",
                f"rows must ascend within the batch of {batch_length} rows, got "
                f"{rows[:8].tolist()}{'...' if rows.size > 8 else ''}",
            )
        return rows
