"""Local members: the trainer host's own cores running the loader's pipeline as members of its
fleet, placed by the same policy as remote workers (`RemoteDataLoader.local_members`).

A local member is a worker object without sockets (`LocalWorker`, reached through a transport
that calls it, `_LocalTransport`), joined to the driver through the same door as a remote
worker. Its pipeline identity is computed by the code a worker's is (`loadax.identity`), and it
joins only when that is the identity the remote fleet agreed on (or the pinned one): local
members never vote. Each member makes its batches on an executor of its own (its threads, or
one child process), started in the order they are asked for. A child process's batches are
encoded as a worker's are; a thread member's are handed over as decoding their encoding would
give them (`loadax.wire.decoded_form`), so that placement never changes a byte; neither is
checksummed nor named by the request's digest: they are made and used in this process
(`loadax.client.transports.reply.InProcess`). The cores they hold are reported to the policy,
which passes over a worker on this host while they hold them all (`loadax.client.host_cores`),
unless `same_host="worker"`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import loadax
from loadax.client.driver import Driver
from loadax.client.fleet_watch import LOCAL_PREFIX
from loadax.client.identity import require
from loadax.client.member import Identity, ask
from loadax.client.spare_cores import spare_cores
from loadax.client.transports.reply import InProcess, Reply
from loadax.errors import RecordError, WorkerError
from loadax.execution.executor import Executor, FuturePending, Pending
from loadax.execution.heap import keep_freed_memory
from loadax.execution.pickled import PickledPipeline
from loadax.execution.pipeline import Pipeline
from loadax.execution.processes import ProcessExecutor
from loadax.execution.threads import ThreadExecutor
from loadax.factories import pipeline_from_config
from loadax.identity.fingerprint import pipeline_fingerprint
from loadax.identity.probes import probe_batches
from loadax.wire.decoded_form import decoded_form
from loadax.wire.failures import PipelineFailed, RecordFailed
from loadax.wire.limits import DEFAULT_TIMEOUT_S
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import plan_from_wire, request_plan, work_from_wire
from loadax.wire.v1 import worker_pb2 as wire

KINDS = ("threads", "processes")
SAME_HOST = ("fallback", "worker")
LOCAL_DEPTH = 2
"""Requests a local member is sent at once, started in the order sent: its threads go on to the
second's records while the first's last ones finish."""

Kind = Literal["threads", "processes"]
SameHost = Literal["fallback", "worker"]


@dataclasses.dataclass(frozen=True, slots=True)
class LocalSpec:
    """What `local_members` asked for: `count` members (or "auto") running `pipeline`, or the
    loader's pipeline of the worker config at `config`, on `kind` (a thread, or a child process,
    each); a worker on this host kept as their fallback, or used as any worker (`same_host`)."""

    count: int | Literal["auto"]
    pipeline: Pipeline[Any, Any] | None = None
    kind: Kind = "threads"
    config: str | Path | None = None
    same_host: SameHost = "fallback"

    def __post_init__(self) -> None:
        if self.count != "auto" and (
            not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 0
        ):
            raise ValueError(
                f"local_members count must be an int >= 0 or 'auto', got {self.count!r}"
            )
        if (self.pipeline is None) == (self.config is None):
            raise ValueError(
                "local_members needs a pipeline (pipeline=Pipeline(...)) or the worker config "
                "that names it (config=PATH), not both"
            )
        if self.pipeline is not None and not isinstance(self.pipeline, Pipeline):
            raise ValueError(
                f"local_members pipeline must be a loadax.Pipeline, got "
                f"{type(self.pipeline).__name__}"
            )
        if self.config is not None and not isinstance(self.config, str | Path):
            raise ValueError(
                f"local_members config must be the path of a worker config, got "
                f"{type(self.config).__name__}"
            )
        if self.kind not in KINDS:
            raise ValueError(
                f"local_members kind must be 'threads' or 'processes', got {self.kind!r}"
            )
        if self.same_host not in SAME_HOST:
            raise ValueError(
                f"local_members same_host must be 'fallback' or 'worker', got {self.same_host!r}"
            )


class LocalWorker:
    """Pipeline `name` served in this process as a worker object: its identity (fingerprint and
    schema, computed once, as a worker computes them) in `handshake`, and its batches (`start`,
    then `answer`) on one executor per member (`executor()`): threads, or with `pickled` (how
    child processes get the pipeline) a child process."""

    def __init__(
        self, name: str, pipeline: Pipeline[Any, Any], pickled: PickledPipeline[Any] | None
    ) -> None:
        self._name, self._pipeline, self._pickled = name, pipeline, pickled
        self.fingerprint = pipeline_fingerprint(pipeline)
        self._schema, _ = probe_batches(name, pipeline)
        if pickled is None:  # this process loads: it keeps what a batch freed, as a local
            keep_freed_memory(arenas=None)  # loader's does (`loadax.execution.heap`)

    @classmethod
    def of(cls, spec: LocalSpec, name: str) -> LocalWorker:
        """The local worker `spec` asks for, of the loader's pipeline `name`: from its config as
        a worker builds it (child processes build it again from its factory), or as given."""
        processes = spec.kind == "processes"
        if spec.config is not None:
            pipeline, rebuild = pipeline_from_config(spec.config, name)
            pickled = PickledPipeline.built_by(rebuild) if processes else None
        else:
            assert spec.pipeline is not None
            pipeline = spec.pipeline
            pickled = PickledPipeline(pipeline) if processes else None
        return cls(name, pipeline, pickled)

    @property
    def identity(self) -> Identity:
        """What its handshake answers, as a loader binds to it."""
        return Identity(self.fingerprint, self._pipeline.num_records, self._pipeline.window)

    def executor(self, threads: int) -> Executor[Any]:
        """One member's: `threads` threads that split each batch, or one child process that
        hands out encoded batches."""
        if self._pickled is None:
            return ThreadExecutor(self._pipeline, threads)
        return ProcessExecutor(self._pickled, 1, encoded=True)

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        if request.pipeline != self._name:
            raise WorkerError(
                "NOT_FOUND", f"this local member serves {self._name!r}, not {request.pipeline!r}"
            )
        num_records = self._pipeline.num_records
        plan_from_wire(request.plan, num_records)
        return wire.HandshakeResponse(
            library_version=loadax.__version__,
            pipeline=self._name,
            fingerprint=self.fingerprint,
            num_records=num_records,
            stream_window=self._pipeline.window,
            schema=self._schema,
            max_in_flight_per_client=LOCAL_DEPTH,
        )

    def start(self, executor: Executor[Any], request: wire.BatchRequest) -> FuturePending[Any]:
        """The batch `request` asks for, started on `executor` (`executor()`'s, whose batches
        are futures) now; a `WorkerError` as a worker would answer it when the request is not
        this member's or its pipeline's code fails."""
        if request.fingerprint != self.fingerprint:
            raise WorkerError(
                "FAILED_PRECONDITION",
                f"a local member of pipeline {self._name!r} has fingerprint "
                f"{self.fingerprint[:12]}, the request {request.fingerprint[:12] or 'none'}",
            )
        plan, work = request_plan(request.plan), work_from_wire(request)
        with _answered(request.step):
            making = executor.submit(plan, work)
        assert isinstance(making, FuturePending), "a member's executor hands out futures"
        return making

    def answer(self, request: wire.BatchRequest, making: Pending[Any], slots: int) -> Reply:
        """The reply to `request` once `making` (`start`) is made, naming `slots` loading
        slots: a thread member's batch as decoding its encoding would give it, a child
        process's encoding, without a checksum (0) and with the request itself for its digest
        (`InProcess`); the failure a worker would answer when a record or the pipeline's code
        fails."""
        with _answered(request.step):
            made = making.result()
        if self._pickled is not None:
            encoded = EncodedBatch(request.step, [made], self.fingerprint, loading_slots=slots)
            return Reply(encoded.header, encoded.frames, encoded.checksum, InProcess(request))
        handed = InProcess(request, handed_over=True, batch=decoded_form(made))
        header = wire.BatchResponse(
            step=request.step, fingerprint=self.fingerprint, loading_slots=slots
        )
        return Reply(header, (), 0, handed)


@contextlib.contextmanager
def _answered(step: int) -> Iterator[None]:
    """Raise what a worker would answer for a batch of `step` that failed: a record's failure,
    or the pipeline's."""
    try:
        yield
    except RecordError as error:
        raise RecordFailed.of(error) from error
    except Exception as error:
        raise PipelineFailed.of(error, step) from error


class _LocalTransport:
    """One local member as a transport: `worker`'s pipeline on an executor of its own (of
    `threads` threads, of kind threads), named `name`. Each batch is started as its request is
    sent, in the order sent, so that the executor's threads go on to the next batch's records
    while the last of one's finish, as the local loader's do (no barrier between batches), and
    each is answered on the thread that finishes it (`FuturePending.when_done`), not by a
    thread waiting for it. Threads are started on the sender's (the driver's) thread: queueing
    a batch's chunks is quick. Either thread of its own would be one more thread to wake per
    batch, on cores the executor's threads keep busy. A child process is started on a thread of
    its own (it starts at its first batch, the forkserver first, which would hold up every
    other member's events on the driver's). Its batch is made and used in this process:
    nothing could change it on the way, so it is not checksummed, and a thread member's is
    handed over without its encoding (`LocalWorker.answer`); its other checks stand. Its replies
    name its threads as its loading slots, so that the policy weighs it against workers by
    their slots (its load is this loader's alone)."""

    def __init__(self, worker: LocalWorker, threads: int, name: str) -> None:
        self.name, self._worker, self._threads = name, worker, threads
        self._executor = worker.executor(threads)
        self._starting = (
            None
            if isinstance(self._executor, ThreadExecutor)
            else ThreadPoolExecutor(1, thread_name_prefix="loadax-local")
        )
        self._lock = threading.Lock()  # a batch is not started on threads being resized

    def split(self, threads: int) -> None:
        """Make each batch from now on on `threads` threads (the same batch on any number)."""
        assert isinstance(self._executor, ThreadExecutor), "only a thread member splits"
        with self._lock:
            self._executor.resize(threads)
            self._threads = threads

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        del timeout  # a direct call has nothing to wait for
        return self._worker.handshake(request)

    def send(self, request: wire.BatchRequest) -> Future[Reply]:
        reply: Future[Reply] = Future()
        if self._starting is None:
            self._start(request, reply)
        else:
            self._starting.submit(self._start, request, reply)
        return reply

    def _start(self, request: wire.BatchRequest, reply: Future[Reply]) -> None:
        """Start the batch `request` asks for, unless `reply` was cancelled; `reply` is settled
        on the thread that makes it, once it is made (cancelling `reply` drops it)."""
        if reply.cancelled():
            return
        try:
            with self._lock:
                making, slots = self._worker.start(self._executor, request), self._threads
        except WorkerError as error:
            _settle(reply, error)
            return
        reply.add_done_callback(lambda done: making.cancel() if done.cancelled() else None)
        making.when_done(functools.partial(self._finish, request, slots, reply))

    def _finish(
        self, request: wire.BatchRequest, slots: int, reply: Future[Reply], making: Pending[Any]
    ) -> None:
        try:
            answer = self._worker.answer(request, making, slots)
        except BaseException as error:  # anything else would leave the driver waiting
            _settle(reply, error)
            return
        _settle(reply, answer)

    def close(self) -> None:
        """Stop starting batches (the driver's call); `release` stops making them."""
        if self._starting is not None:
            self._starting.shutdown(wait=False, cancel_futures=True)

    def release(self) -> None:
        """Stop the executor's threads or child process, once they are done."""
        self._executor.release(wait=True)


def _settle(reply: Future[Reply], outcome: Reply | BaseException) -> None:
    """Give `reply` its `outcome`, unless the driver cancelled it meanwhile."""
    with contextlib.suppress(InvalidStateError):
        if isinstance(outcome, BaseException):
            reply.set_exception(outcome)
        else:
            reply.set_result(outcome)


class LocalMembers:
    """The local members of one loader, running `worker`, joined to `driver` once their
    identity is checked against the loader's (`identity`, of pipeline `name`); `handshake` is
    the loader's handshake request. They start as `resize(count)`, which adds or removes
    members; `close()` stops them."""

    def __init__(
        self,
        spec: LocalSpec,
        worker: LocalWorker,
        name: str,
        identity: Identity,
        handshake: wire.HandshakeRequest,
        driver: Driver,
        count: int,
    ) -> None:
        self.spec, self._driver, self._handshake = spec, driver, handshake
        self._worker = worker
        self._identity, self._name = identity, name
        self._lock = threading.Lock()
        self._members: list[tuple[str, _LocalTransport]] = []
        self._next = 0
        try:
            self.resize(count)
        except BaseException:
            self.close()
            raise

    def resize(self, count: int) -> None:
        """Run `count` members (one thread or child process each); with "auto", give them
        `count` cores: of kind threads, one member that splits each batch over them as a worker
        does (a batch is made as soon as it can be), of kind processes, a member on each. The
        first member checks the identity: a ValueError naming both identities when it is not
        the loader's. The policy is told the cores they hold (unless `same_host="worker"`)."""
        one = self.spec.count == "auto" and self.spec.kind == "threads"
        members, threads = (min(count, 1), max(count, 1)) if one else (count, 1)
        with self._lock:
            while len(self._members) < members:
                self._add(threads)
            while len(self._members) > members:
                name, member = self._members.pop()
                self._driver.leave(name)
                member.release()
            if one:
                for _, member in self._members:
                    member.split(threads)
            if self.spec.same_host == "fallback":
                self._driver.local_cores(len(self._members) * threads, spare_cores())

    def _add(self, threads: int) -> None:
        transport = _LocalTransport(self._worker, threads, f"{LOCAL_PREFIX}{self._next}")
        try:
            member = ask(transport, self._handshake, timeout=0)
            require(member, self._identity, self._name)
        except ValueError as error:
            transport.close()
            transport.release()
            raise ValueError(
                f"local members cannot join: {error}. They run the pipeline given to "
                "local_members, which must be the one the workers serve (local members never "
                "choose the loader's identity)"
            ) from None
        except BaseException:
            transport.close()
            transport.release()
            raise
        self._next += 1
        self._members.append((transport.name, transport))
        self._driver.join(member)

    def close(self) -> None:
        with self._lock:
            members, self._members = self._members, []
        for _, member in members:
            member.release()
