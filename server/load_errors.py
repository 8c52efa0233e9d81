"""What a worker answers when a request's work cannot be made as asked: work that does not fit
the pipeline or the plan (`checked`), a load that failed (`load_failure`: the pipeline's own
error, which any worker would meet, or this worker's), and work that killed or stalled what
loaded it (`poisoned`, naming its rows and records)."""

from __future__ import annotations

import logging
from concurrent.futures import CancelledError
from typing import Any

from loadax.errors import StorageError, WorkerError
from loadax.execution.pipeline import Pipeline
from loadax.execution.process_errors import ChildRaised, WorkerProcessError
from loadax.logfields import fields
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.failures import MAX_CAUSE_CHARS, PipelineFailed, PoisonFailed, shorten
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger("loadax.server.worker")  # the worker's log, as before this module


def checked(name: str, pipeline: Pipeline[Any, Any], plan: Plan, work: Work) -> int:
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


def load_failure(request: wire.BatchRequest, work: Work, error: Exception) -> WorkerError:
    """The answer to `request` when making `work` raised `error`: `PipelineFailed` when the
    pipeline's own code raised or the store refused (any worker would), else the worker's own
    failure, which another worker may not have: UNAVAILABLE for its machine (memory, a store it
    cannot reach, files) or for work its closing cancelled, INTERNAL for its loader processes
    (logged with the traceback)."""
    if isinstance(error, ChildRaised) or not isinstance(
        error, WorkerProcessError | CancelledError | OSError | MemoryError
    ):
        return PipelineFailed.of(error, request.step)
    if isinstance(error, StorageError) and not error.transient:
        return PipelineFailed.of(error, request.step)  # the store refuses every worker alike
    if isinstance(error, CancelledError):  # not started before the worker was closed
        return WorkerError("UNAVAILABLE", f"{work} was cancelled: this worker is shutting down")
    summary = shorten(
        f"{work} failed on this worker: {type(error).__name__}: {error}", MAX_CAUSE_CHARS
    )
    if isinstance(error, OSError | MemoryError):
        return WorkerError("UNAVAILABLE", summary)
    log.error(
        "%s of pipeline %r failed",
        work,
        request.pipeline,
        exc_info=error,
        extra=fields(
            event="load_failed",
            pipeline=request.pipeline,
            step=request.step,
            status="INTERNAL",
            error=error,
        ),
    )
    return WorkerError("INTERNAL", summary)


def poisoned(
    request: wire.BatchRequest, pipeline: Pipeline[Any, Any], plan: Plan, work: Work, reason: str
) -> PoisonFailed:
    """The answer that `work` killed or stalled what loaded it, naming its rows and records."""
    indices, epochs = pipeline.positions(plan, work)
    rows = list(request.rows) or list(range(len(indices)))
    return PoisonFailed.of(str(work), rows, indices.tolist(), epochs.tolist(), reason)
