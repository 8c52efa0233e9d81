"""The worker's core, independent of transport: handshakes and batch requests in, replies out.

It holds no per-client state: a batch is a pure function of (pipeline, plan, step, rows), so any
worker can serve any request. Every bad request is a `WorkerError` naming what is wrong. An
optional memory budget bounds the bytes of the batches it builds at once, whatever the request rate.

Record work runs on threads, or with `processes` in child processes (the local loader's
`ProcessExecutor`: forkserver, shared memory), so that GIL-bound transforms use every core and
work that crashes or hangs its process costs one child, not the worker. Work that kills its child
or runs past `request_deadline_s` is answered `PoisonFailed`, naming the work, its rows and
records; on threads, a request past its deadline is answered so too, but its thread stays stuck
in it, and once every loading slot is, the worker reports NOT_SERVING (`serving`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import loadax
from loadax.dataset.stream import ALL_ITEMS
from loadax.errors import RecordError, WorkerError
from loadax.execution.executor import Pending
from loadax.execution.pickled import PickledPipeline
from loadax.execution.pipeline import Pipeline
from loadax.execution.process_errors import WorkerProcessLost
from loadax.execution.threads import ThreadExecutor
from loadax.factories import Rebuild
from loadax.identity.fingerprint import pipeline_fingerprint
from loadax.identity.probes import probe_batches
from loadax.logfields import fields
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.server.config import WorkerConfig, build_pipelines, load_config
from loadax.server.load_errors import checked, load_failure, poisoned
from loadax.server.memory import MemoryBudget, default_budget, too_large
from loadax.server.pipeline_executor import pipeline_executor
from loadax.server.share_cache import DEFAULT_SHARE, ShareCache
from loadax.validation import is_int, require_int, require_positive
from loadax.wire.codec import encode_frames
from loadax.wire.failures import RecordFailed
from loadax.wire.payloads import EncodedBatch, answer_checksum
from loadax.wire.plans import compatible_versions, plan_from_wire, request_plan, work_from_wire
from loadax.wire.shared_memory import ClientFile
from loadax.wire.stacked_payload import PooledPayload, StackedPayload
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)

DEFAULT_MEMORY_WAIT_S = 30.0
"""How long a batch request waits for room in the memory budget before RESOURCE_EXHAUSTED."""
DEFAULT_REQUEST_DEADLINE_S = 60.0
"""How long loading one request's work may take before it is given up as poison (below the
client's default `no_worker_timeout`, so that the trainer hears of it first)."""


class Worker:
    """Serves batches of named pipelines; `threads` read the records of each batch, or, with
    `processes`, that many child processes per pipeline (started on its first request) load
    whole batches (each gets the pipeline from `rebuilt`, e.g. a `Rebuild` of its factory, or
    pickled). Loading a request's work may take `request_deadline_s`.

    The batches being built and their encodings not yet returned stay within
    `memory_budget_bytes` (by default a share of the machine's memory, `default_budget`): a
    request waits (in arrival order, up to `memory_wait_s` seconds, then RESOURCE_EXHAUSTED)
    until the budget has room for it. A request's size is the encoded size last seen for its
    pipeline and number of rows, else what the bytes per row seen of its pipeline (the start-up
    probes) make of its rows; one that nothing tells of runs alone. A batch larger than the
    whole budget, or than the reply its transport may send, is refused with INVALID_ARGUMENT:
    before it is built when its size can be told from the bytes per row seen (the start-up
    probes), else once it is built.

    A batch's bytes stay reserved until the transport calls its `release()`, once the reply has
    been sent: a reply that a slow client has not read still counts. What the budget does not
    count: building a batch briefly holds the records, the collated batch and its encoding
    together, about three times its encoded size; leave room for that when choosing the budget.

    Requests with one digest are computed once (`share_cache`, used by the request path), and
    up to `share_cache_bytes` of the replies built recently (by default 1/4 of the budget; 0:
    none) are kept for requests that come a little later, within the budget.
    """

    def __init__(
        self,
        pipelines: Mapping[str, Pipeline[Any, Any]],
        *,
        threads: int = 4,
        processes: int = 0,
        request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S,
        rebuilt: Mapping[str, PickledPipeline[Any]] | None = None,
        memory_budget_bytes: int | None = None,
        memory_wait_s: float = DEFAULT_MEMORY_WAIT_S,
        shared_memory: bool = True,
        share_cache_bytes: int | None = None,
    ) -> None:
        if not pipelines:
            raise ValueError("a worker needs at least one pipeline")
        require_int("threads", threads, minimum=1)
        require_int("processes", processes, minimum=0)
        require_positive("request_deadline_s", request_deadline_s)
        if memory_budget_bytes is not None and not is_int(memory_budget_bytes, minimum=1):
            raise ValueError(
                f"memory_budget_bytes must be None or an int >= 1, got {memory_budget_bytes!r}"
            )
        require_positive("memory_wait_s", memory_wait_s)
        if share_cache_bytes is not None:
            require_int("share_cache_bytes", share_cache_bytes, minimum=0)
        for name, pipeline in pipelines.items():
            if not isinstance(pipeline, Pipeline):
                raise ValueError(
                    f"pipeline {name!r} must be a loadax.Pipeline, got {type(pipeline).__name__}"
                )
            if pipeline.stream is not None and pipeline.stream.items != ALL_ITEMS:
                raise ValueError(
                    f"pipeline {name!r}: a stream's take/skip ({pipeline.stream.items!r}) are "
                    "applied by the loader that cuts its batches, a worker's client, which does "
                    "not know them; take or skip the records of the dataset under the stream"
                )
        self._pipelines = dict(pipelines)
        self.shared_memory = shared_memory
        """Whether clients on this host may have payloads written into their memory files."""
        self._threads, self._processes = threads, processes
        self._deadline_s = float(request_deadline_s)
        self._executors = {
            name: pipeline_executor(
                name, pipeline, (rebuilt or {}).get(name), threads, processes, self._deadline_s
            )
            for name, pipeline in pipelines.items()
        }
        # Requests past their deadline whose threads are still stuck in them.
        self._wedged: list[Pending[Any]] = []
        self._wedged_lock = threading.Lock()
        # Each pipeline's fingerprint (see loadax.identity): its probe runs on its threads,
        # or here when children load its batches (they hand out encodings, not batches).
        self._fingerprints = {
            name: pipeline_fingerprint(
                pipeline, executor=None if processes else self._executors[name]
            )
            for name, pipeline in pipelines.items()
        }
        self._budget = MemoryBudget(
            default_budget() if memory_budget_bytes is None else memory_budget_bytes,
            float(memory_wait_s),
        )
        self.share_cache = ShareCache(
            self._budget,
            self._budget.limit // DEFAULT_SHARE if share_cache_bytes is None else share_cache_bytes,
        )
        """Where requests with one digest meet: one computation, and the replies built lately."""
        # What every batch looks like, announced in handshakes: derived once, from probe batches,
        # whose sizes tell the budget the bytes per row.
        self._schemas: dict[str, wire.BatchSchema | None] = {}
        for name, pipeline in pipelines.items():
            self._schemas[name], sizes = probe_batches(name, pipeline)
            for rows, size in sizes:
                self._budget.learn((name, rows), size)

    @classmethod
    def from_config(cls, config: WorkerConfig | str | Path) -> Worker:
        """The worker a config (or the config file at a path) describes."""
        if not isinstance(config, WorkerConfig):
            config = load_config(config)
        rebuilt = {
            pipeline.name: PickledPipeline.built_by(Rebuild(config.source, pipeline))
            for pipeline in config.pipelines
        }
        return cls(
            build_pipelines(config),
            threads=config.threads,
            processes=config.processes,
            request_deadline_s=config.request_deadline_s,
            rebuilt=rebuilt,
            memory_budget_bytes=config.memory_budget_bytes,
            shared_memory=config.shared_memory,
            share_cache_bytes=config.share_cache_bytes,
        )

    @property
    def memory_budget(self) -> MemoryBudget:
        """The budget of the bytes of batches being built and not yet sent."""
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
            schema=self._schemas[request.pipeline],
        )

    def load_batch(
        self,
        request: wire.BatchRequest,
        max_reply_bytes: int | None = None,
        *,
        checksummed: bool = True,
        into: ClientFile | None = None,
    ) -> EncodedBatch:
        """Identity check, the work from the wire, admission (the memory budget), loading; the
        answer's header names the request and carries the payload's checksum (unless not
        `checksummed`: then whoever sends it computes it, `EncodedBatch.checksum`); stacked `into`
        its client's memory file if given, where it can be (`EncodedBatch.borrowed`), else in
        this process, with XXH3 in chunks hashed as it is stacked (`PooledPayload`). A batch of
        more than `max_reply_bytes` (what the transport's reply may hold; None: no limit) or than
        the memory budget is refused (INVALID_ARGUMENT), before it is built when its size is
        known from the bytes per row seen."""
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
        plan = request_plan(request.plan)
        work = work_from_wire(request)
        kind = (request.pipeline, checked(request.pipeline, pipeline, plan, work))
        # The tighter of the two limits, as a refusal names it.
        limit, room = self._budget.limit, self._budget.room
        if max_reply_bytes is not None and max_reply_bytes < limit:
            limit, room = max_reply_bytes, f"the {max_reply_bytes} a reply may hold"
        if (estimate := self._budget.estimate(kind)) > limit:
            raise too_large(work, estimate, room)
        release = self._budget.reserve(kind, work)
        # Else in this process, each chunk hashed by the loading thread that stacks it.
        stack = into or PooledPayload(answer_checksum(request), max_reply_bytes)
        try:
            frames = self._load(request, plan, work, stack)
            batch = EncodedBatch.answering(request, expected, frames, checksummed=False)
            self._budget.learn(kind, batch.size)
            if batch.size > limit:
                raise too_large(work, batch.size, room)
            checksum = stack.checksum(frames) if checksummed else None
            borrowed = into is not None and into.holds(frames)
        except BaseException:
            release()
            raise
        # Reserved until the transport has sent the reply (or dropped it).
        return dataclasses.replace(batch, checksum=checksum, borrowed=borrowed, release=release)

    @property
    def serving(self) -> bool:
        """Whether a request can be loaded: False once every loading slot (`threads`) is stuck
        in work that ran past its deadline. Children past it are replaced, so never with
        `processes`."""
        return not self._stuck()

    def _stuck(self) -> str | None:
        """Why no request can be loaded, or None."""
        with self._wedged_lock:
            self._wedged = [pending for pending in self._wedged if _running(pending)]
            stuck = len(self._wedged)
        if stuck < self._threads:
            return None
        return (
            f"all {self._threads} loading threads are stuck in requests that ran past "
            f"request_deadline_s = {self._deadline_s:g} s; restart the worker (run record work "
            "in child processes, [server] processes, to have such requests stopped instead)"
        )

    def info(self, request: wire.InfoRequest) -> wire.InfoResponse:
        del request  # nothing to ask
        stuck = self._stuck()
        return wire.InfoResponse(
            status="SERVING" if stuck is None else "NOT_SERVING",
            status_reason=stuck or "",
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
        """Release the record-loading threads (after in-flight work finishes; threads stuck past
        their deadline are not waited for) and child processes."""
        with self._wedged_lock:
            wedged = bool(self._wedged)
        for executor in self._executors.values():
            executor.release(wait=not wedged)

    def _load(
        self, request: wire.BatchRequest, plan: Plan, work: Work, into: StackedPayload
    ) -> list[bytes | memoryview]:
        """The frames of the batch `work` makes (stacked `into` that payload by loading threads;
        children encode theirs): a failure is a `WorkerError` naming `work`, a `RecordFailed`
        naming the record when one failed, `PoisonFailed` when the work killed its child process
        or ran past the deadline."""
        pipeline = self._pipelines[request.pipeline]
        executor = self._executors[request.pipeline]
        if isinstance(executor, ThreadExecutor):
            pending = executor.submit(plan, work, into)
        else:
            pending = executor.submit(plan, work)
        try:
            if self._processes:
                # The child encoded it; it stops at the deadline itself.
                return [pending.result()]
            try:
                return encode_frames(pending.result(self._deadline_s))
            except TimeoutError:
                with self._wedged_lock:
                    self._wedged.append(pending)
                log.error(
                    "%s of pipeline %r ran past request_deadline_s = %g s; its thread stays stuck "
                    "in it",
                    work,
                    request.pipeline,
                    self._deadline_s,
                    extra=fields(
                        event="poisoned",
                        pipeline=request.pipeline,
                        step=request.step,
                        duration_s=self._deadline_s,
                        error="ran past request_deadline_s",
                    ),
                )
                raise poisoned(
                    request,
                    pipeline,
                    plan,
                    work,
                    f"it ran past request_deadline_s = {self._deadline_s:g} s on a loading thread",
                ) from None
        except WorkerProcessLost as error:
            log.error(
                "%s of pipeline %r: %s",
                work,
                request.pipeline,
                error.reason,
                extra=fields(
                    event="poisoned",
                    pipeline=request.pipeline,
                    step=request.step,
                    error=error.reason,
                ),
            )
            raise poisoned(request, pipeline, plan, work, error.reason) from error
        except RecordError as error:
            raise RecordFailed.of(error) from error
        except WorkerError:
            raise  # the answer already: poison
        except Exception as error:
            raise load_failure(request, work, error) from error

    def _pipeline(self, name: str) -> Pipeline[Any, Any]:
        if name not in self._pipelines:
            raise WorkerError(
                "NOT_FOUND",
                f"unknown pipeline {name!r}: this worker serves {sorted(self._pipelines)}",
            )
        return self._pipelines[name]


def _running(pending: Pending[Any]) -> bool:
    """Whether `pending` is still being loaded."""
    try:
        pending.result(timeout=0)
    except TimeoutError:
        return True
    except BaseException:
        return False
    return False
