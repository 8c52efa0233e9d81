"""The worker's core, independent of transport: handshakes and batch requests in, replies out.

It holds no per-client state: a batch is a pure function of (pipeline, plan, step, rows), so any
worker can serve any request. Every bad request is a `WorkerError` naming what is wrong. An
optional memory budget bounds the bytes of the batches it builds at once, whatever the request rate.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import loadax
from loadax.errors import RecordError, WorkerError
from loadax.execution.executor import Pending
from loadax.execution.pipeline import Pipeline
from loadax.execution.threads import ThreadExecutor
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.server.config import WorkerConfig, build_pipelines, load_config
from loadax.server.memory import MemoryBudget
from loadax.validation import is_int, require_positive
from loadax.wire.codec import encode_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import compatible_versions, plan_from_wire, work_from_wire
from loadax.wire.v1 import worker_pb2 as wire

DEFAULT_MEMORY_WAIT_S = 30.0
"""How long a batch request waits for room in the memory budget before RESOURCE_EXHAUSTED."""


def fingerprint(name: str, pipeline: Pipeline[Any, Any], origin: Mapping[str, Any]) -> str:
    """Identifies what a pipeline serves: its name, length, batcher and where it came from."""
    identity = {
        "name": name,
        "num_records": pipeline.num_records,
        "dataset": type(pipeline.records).__qualname__,
        "stream": None if pipeline.stream is None else repr(pipeline.stream),
        "batcher": repr(pipeline.batcher),
        "origin": origin,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=repr).encode()).hexdigest()


class Worker:
    """Serves batches of named pipelines; `threads` read the records of each batch.

    With `memory_budget_bytes`, the batches being built and their encodings not yet returned
    stay within that many bytes: a request waits (in arrival order, up to `memory_wait_s`
    seconds, then RESOURCE_EXHAUSTED) until the budget has room for it. A request's size is the
    encoded size last seen for its pipeline and number of rows; the first request of a kind runs
    alone, and a kind larger than the whole budget is refused with RESOURCE_EXHAUSTED.

    What the budget does not count: its bytes are released when `load_batch` returns, but the
    transport still holds the reply while it sends it (gRPC a serialized copy, ZeroMQ the payload
    itself), and building a batch briefly holds the records, the collated batch and its encoding
    together, about three times its encoded size. The transports' in-flight limits bound the first;
    leave room for the second when choosing the budget.
    """

    def __init__(
        self,
        pipelines: Mapping[str, Pipeline[Any, Any]],
        *,
        threads: int = 4,
        origins: Mapping[str, Mapping[str, Any]] | None = None,
        memory_budget_bytes: int | None = None,
        memory_wait_s: float = DEFAULT_MEMORY_WAIT_S,
    ) -> None:
        if not pipelines:
            raise ValueError("a worker needs at least one pipeline")
        if memory_budget_bytes is not None and not is_int(memory_budget_bytes, minimum=1):
            raise ValueError(
                f"memory_budget_bytes must be None or an int >= 1, got {memory_budget_bytes!r}"
            )
        require_positive("memory_wait_s", memory_wait_s)
        for name, pipeline in pipelines.items():
            if not isinstance(pipeline, Pipeline):
                raise ValueError(
                    f"pipeline {name!r} must be a loadax.Pipeline, got {type(pipeline).__name__}"
                )
        self._pipelines = dict(pipelines)
        self._executors = {
            name: ThreadExecutor(pipeline, threads) for name, pipeline in pipelines.items()
        }
        self._fingerprints = {
            name: fingerprint(name, pipeline, (origins or {}).get(name, {}))
            for name, pipeline in pipelines.items()
        }
        self._budget = (
            None
            if memory_budget_bytes is None
            else MemoryBudget(memory_budget_bytes, float(memory_wait_s))
        )

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
        return cls(
            build_pipelines(config),
            threads=config.threads,
            origins=origins,
            memory_budget_bytes=config.memory_budget_bytes,
        )

    @property
    def memory_budget(self) -> MemoryBudget | None:
        """The budget of the bytes of batches being built, when one was set."""
        return self._budget

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        if not compatible_versions(request.library_version, loadax.__version__):
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"client loadax {request.library_version!r} cannot use worker loadax "
                f"{loadax.__version__!r}: major and minor versions must match",
            )
        pipeline = self._pipeline(request.pipeline)
        num_records = pipeline.num_records
        plan_from_wire(request.plan, num_records)
        return wire.HandshakeResponse(
            library_version=loadax.__version__,
            pipeline=request.pipeline,
            fingerprint=self._fingerprints[request.pipeline],
            num_records=num_records,
            stream_window=pipeline.window,
        )

    def load_batch(self, request: wire.BatchRequest) -> EncodedBatch:
        """Identity check, the work from the wire, admission (the memory budget), loading."""
        pipeline = self._pipeline(request.pipeline)
        expected = self._fingerprints[request.pipeline]
        if request.fingerprint != expected:
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"pipeline {request.pipeline!r} has fingerprint {expected[:12]} on this worker, "
                f"the client expects {request.fingerprint[:12] or 'none'}",
            )
        num_records = pipeline.num_records
        if request.plan.num_records != num_records:
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"the plan has {request.plan.num_records} records, pipeline "
                f"{request.pipeline!r} has {num_records}",
            )
        plan = plan_from_wire(request.plan)
        work = work_from_wire(request)
        size = _checked(request.pipeline, pipeline, plan, work)
        executor = self._executors[request.pipeline]
        if self._budget is None:
            return EncodedBatch(request.step, _encoded(executor.submit(plan, work), work))
        kind = (request.pipeline, size)
        reserved = self._budget.reserve(kind, work)
        try:
            batch = EncodedBatch(request.step, _encoded(executor.submit(plan, work), work))
            self._budget.learn(kind, batch.size)
            if batch.size > self._budget.limit:
                raise WorkerError(
                    "RESOURCE_EXHAUSTED",
                    f"{work} of pipeline {request.pipeline!r} encodes to {batch.size} "
                    f"bytes ({size} rows), more than this worker's memory budget of "
                    f"{self._budget.limit} bytes; ask for fewer rows per request",
                )
            return batch
        finally:
            # The transport holds the reply a little longer: see the class docstring.
            self._budget.release(reserved)

    def info(self, request: wire.InfoRequest) -> wire.InfoResponse:
        del request  # nothing to ask
        return wire.InfoResponse(
            library_version=loadax.__version__,
            pipelines=[
                wire.PipelineInfo(
                    name=name,
                    fingerprint=self._fingerprints[name],
                    num_records=pipeline.num_records,
                    stream_window=pipeline.window,
                )
                for name, pipeline in self._pipelines.items()
            ],
        )

    def close(self) -> None:
        """Release the record-loading threads (after in-flight work finishes)."""
        for executor in self._executors.values():
            executor.release(wait=True)

    def _pipeline(self, name: str) -> Pipeline[Any, Any]:
        if name not in self._pipelines:
            raise WorkerError(
                "NOT_FOUND",
                f"unknown pipeline {name!r}: this worker serves {sorted(self._pipelines)}",
            )
        return self._pipelines[name]


def _checked(name: str, pipeline: Pipeline[Any, Any], plan: Plan, work: Work) -> int:
    """How many records `work` reads, once it is checked against the pipeline and the plan."""
    try:
        pipeline.require_kind(work)
    except TypeError as error:
        raise WorkerError("FAILED_PRECONDITION", f"pipeline {name!r}: {error}") from None
    try:
        return work.check(plan, pipeline.window)
    except ValueError as error:
        raise WorkerError("INVALID_ARGUMENT", str(error)) from None
    except IndexError as error:
        raise WorkerError("OUT_OF_RANGE", str(error)) from None


def _encoded(pending: Pending[Any], work: Work) -> list[bytes | memoryview]:
    """The frames of the batch `pending` yields; a failure is a `WorkerError` naming `work`."""
    try:
        return encode_frames(pending.result())
    except RecordError as error:
        cause = error.__cause__ or error
        text = "".join(traceback.format_exception(cause))
        raise WorkerError("DATA_LOSS", f"{error}\n{text}") from error
    except Exception as error:
        text = "".join(traceback.format_exception(error))
        raise WorkerError("INTERNAL", f"{work} failed: {error!r}\n{text}") from error
