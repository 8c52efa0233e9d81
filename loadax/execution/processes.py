"""Process workers: whole batches (and stream windows) loaded in worker processes.

Threads cannot run transforms that hold the GIL in parallel; processes can. The pipeline is
pickled once, when the loader is built, and unpickled by each worker process, which the
forkserver starts (never a plain fork of the trainer: its JAX runtime is multithreaded). The
forkserver preloads `loadax`, so a worker starts in milliseconds rather than importing JAX anew;
JAX in a worker runs on the CPU, so that workers never take the trainer's accelerators.

A worker encodes each batch with `loadax.wire.codec` straight into a shared memory segment that the
parent made for it and reuses; only sizes cross the pipe, and arrays are never pickled. The parent
copies the batch out (one memcpy) and decodes it. A segment keeps its /dev/shm name only until
the worker has attached to it, so none is left behind, even when a worker is killed.

With a deadline, a process that runs one work item longer is killed and its item fails with
`WorkerProcessLost`, like one whose process died; a new process takes the slot. With `encoded`,
the parent hands out the encoding itself (for a loadax worker, which sends it on unchanged).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import pickle
import secrets
import signal
import threading
import time
import traceback
import weakref
from collections import deque
from concurrent.futures import CancelledError, Future, InvalidStateError
from multiprocessing import context as mp_context
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import jax
from typing_extensions import TypeVar

from loadax.errors import RecordError
from loadax.execution.executor import Executor, FuturePending, Pending
from loadax.execution.pickled import PickledPipeline
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.codec import CodecError, decode, encode_frames

B = TypeVar("B", default=Any)

EXIT_GRACE_S = 2.0
"""How long a released worker process may take to finish its item and exit before it is killed."""
_PRELOAD = ["__main__", "loadax"]  # the forkserver's default, and loadax with its JAX import


class WorkerProcessError(RuntimeError):
    """A worker process died, could not load the pipeline, or raised what cannot be pickled.

    >>> import os
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.execution.processes import WorkerProcessError
    >>> dying = RangeDataset(3, 5).map(os._exit)  # the process exits (code 3) at record 0
    >>> loader = DataLoader(Batcher()).batch_size(2).workers(1, kind="processes").build(dying)
    >>> with iter(loader) as batches:
    ...     try:
    ...         next(batches)
    ...     except WorkerProcessError as error:
    ...         print(error)
    the batch of step 0 was not loaded: worker process 0 (pid ...) exited with code 3
    """


class WorkerProcessLost(WorkerProcessError):
    """The process loading a work item died, or was stopped past its deadline: the item's own
    records may be what kills it. `work` is the item, `reason` what happened to the process."""

    def __init__(self, work: Work, reason: str) -> None:
        super().__init__(f"{work} was not loaded: {reason}")
        self.work, self.reason = work, reason


@functools.cache
def _context() -> mp_context.BaseContext:
    context = get_context("forkserver")
    # Only heeded before the forkserver starts, which is what the first call here precedes.
    context.set_forkserver_preload(_PRELOAD)
    return context


@dataclasses.dataclass(frozen=True, slots=True)
class _Request:
    """What the parent sends a process: one work item of a plan."""

    plan: Plan
    work: Work

    def __str__(self) -> str:
        return str(self.work)


@dataclasses.dataclass(frozen=True, slots=True)
class _ChildError:
    """An exception raised in a worker process, as the parent rebuilds it."""

    traceback: str
    summary: str  # "TypeName: message" of the error (of the cause, for a record's error)
    pickled: bytes | None  # the error (the cause), when it survives pickling
    record: tuple[int, int] | None  # (index, epoch) of a RecordError

    @classmethod
    def of(cls, error: Exception) -> _ChildError:
        text = "".join(traceback.format_exception(error))
        record = None
        if isinstance(error, RecordError) and isinstance(error.__cause__, Exception):
            record, error = (error.index, error.epoch), error.__cause__
        return cls(text, f"{type(error).__name__}: {error}", _pickled(error), record)

    def rebuild(self, where: str) -> Exception:
        error: Exception = WorkerProcessError(self.summary)
        if self.pickled is not None:
            with contextlib.suppress(Exception):
                error = pickle.loads(self.pickled)
        if self.record is not None:
            cause = error
            error = RecordError(*self.record, cause)
            error.__cause__ = cause
        error.add_note(f"loadax: raised in {where}; the traceback there:\n{self.traceback}")
        return error


def _pickled(error: Exception) -> bytes | None:
    """`error` pickled, if unpickling gives it back (a custom __init__ may not allow that)."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
    except Exception:
        return None
    return data


def _serve(connection: Connection, pipeline_data: bytes) -> None:
    """A worker process: load what the parent asks for, until the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    # A transform that uses JAX must not take the trainer's accelerators (nor their memory).
    jax.config.update("jax_platforms", "cpu")  # type: ignore[no-untyped-call]
    try:
        pipeline = pickle.loads(pipeline_data)
    except Exception:
        connection.send(("broken", traceback.format_exc()))
        return
    segment: SharedMemory | None = None
    with contextlib.suppress(EOFError, BrokenPipeError):  # the parent has gone
        while True:
            request: _Request | None = connection.recv()
            if request is None:  # released: exit normally, running the process's finalizers
                return
            try:
                frames = _encoded(pipeline.run(request.plan, request.work))
            except Exception as error:
                connection.send(("failed", _ChildError.of(error)))
                continue
            size = sum(len(frame) for frame in frames)
            if segment is None or segment.size < size:
                connection.send(("grow", size))
                if segment is not None:
                    segment.close()
                segment = SharedMemory(connection.recv())
            view, offset = _view(segment), 0
            for frame in frames:  # each array's bytes copied once, straight into the segment
                view[offset : offset + len(frame)] = frame
                offset += len(frame)
            connection.send(("done", size))


_EXECUTORS: weakref.WeakSet[ProcessExecutor[Any]] = weakref.WeakSet()


@atexit.register  # after multiprocessing's own exit handler, so it runs before it
def _release_at_exit() -> None:
    """Let the worker processes end normally (multiprocessing's exit would terminate them)."""
    for executor in list(_EXECUTORS):
        executor.release(wait=True)


def _kill_running(workers: list[_Worker]) -> None:
    """Kill those of `workers` whose process is still running (the parent owns the segments)."""
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()


def _view(segment: SharedMemory) -> memoryview:
    view = segment.buf
    if view is None:
        raise ValueError(f"shared memory segment {segment.name} is closed")
    return view


def _encoded(batch: Any) -> list[bytes | memoryview]:
    try:
        return encode_frames(batch)
    except CodecError as error:
        error.add_note(
            "loadax: process workers send batches with loadax.wire.codec: a batch must be dicts, "
            "lists and tuples of numpy arrays, numbers, str, bytes and None"
        )
        raise


@dataclasses.dataclass(eq=False)
class _Task:
    request: _Request
    future: Future[Any] = dataclasses.field(default_factory=Future)
    started: float = 0.0  # when a process took it (time.monotonic())


class _Worker:
    """A worker process, the pipe to it, its task (one at a time) and its shared memory."""

    def __init__(self, slot: int, process: BaseProcess, connection: Connection) -> None:
        self.slot, self.process, self.connection = slot, process, connection
        self.task: _Task | None = None
        self.collector: threading.Thread | None = None
        self.loaded = 0  # work items it has loaded
        self.stopped_for: str | None = None  # why the parent killed it, when it did
        self._segment: SharedMemory | None = None
        self._named = False  # the segment's name is still in /dev/shm

    def __str__(self) -> str:
        return f"worker process {self.slot} (pid {self.process.pid})"

    def new_segment(self, size: int) -> str:
        """Make a segment of at least `size` bytes in place of the current one; its name."""
        capacity = max(size, 2 * self._segment.size) if self._segment is not None else size
        while True:
            try:
                segment = SharedMemory(
                    f"loadax{os.getpid()}_{secrets.token_hex(4)}", create=True, size=capacity
                )
            except FileExistsError:
                continue
            break
        self.drop_segment()
        self._segment, self._named = segment, True
        return segment.name

    def copy_out(self, size: int) -> bytearray:
        """The first `size` bytes of the segment; the worker has attached, so unlink its name."""
        if self._segment is None:
            raise WorkerProcessError(f"{self} wrote a batch without a shared memory segment")
        self._unlink()
        return bytearray(_view(self._segment)[:size])

    def drop_segment(self) -> None:
        self._unlink()
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def _unlink(self) -> None:
        if self._named and self._segment is not None:
            self._segment.unlink()
            self._named = False


class ProcessExecutor(Executor[B]):
    """Loads whole batches (and stream windows) in `workers` processes, several in parallel.

    Batches wait in a queue of the parent until a process is free, so a cancelled one that has
    not started is never loaded. A process that dies, or loads one item for longer than
    `deadline_s` seconds (then it is killed), fails that item with `WorkerProcessLost`. A new
    process takes its place at once if it had loaded an item before; else (it may not be able to
    start at all) the queued items fail too when no process is left, and the next `submit` starts
    new ones. With `encoded`, results are the encoding of each batch (a `bytearray` that
    `loadax.wire.codec.decode` reads), not the batch.
    """

    def __init__(
        self,
        pipeline: PickledPipeline[B],
        workers: int,
        *,
        deadline_s: float | None = None,
        encoded: bool = False,
    ) -> None:
        self._pipeline_data, self._slots = pipeline.data, workers
        self._deadline_s, self._encoded = deadline_s, encoded
        # Reentrant: a finalizer's release() may run in a thread that holds it.
        self._lock = threading.RLock()
        self._workers: list[_Worker | None] = [None] * workers
        self._queue: deque[_Task] = deque()
        self._watchdog: threading.Thread | None = None
        self._released = threading.Event()
        self._ending: list[_Worker] = []  # released, maybe still finishing an item
        _EXECUTORS.add(self)

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        return self._enqueue(_Request(plan, work))

    def release(self, wait: bool) -> None:
        """Stop the processes: each exits once it has finished the item it loads, so that what
        user code made in it is cleaned up (a `datasets` import's semaphores, say), and is killed
        if that takes longer than `EXIT_GRACE_S`. Queued batches are cancelled, loading ones
        dropped; with `wait`, return once every process has ended."""
        with self._lock:
            workers = [worker for worker in self._workers if worker is not None]
            self._workers = [None] * self._slots
            queued, self._queue = self._queue, deque()
            watchdog, self._watchdog = self._watchdog, None
            self._released.set()
            self._ending = [worker for worker in self._ending if worker.process.is_alive()]
            self._ending += workers
            ending = list(self._ending)
        if watchdog is not None:
            watchdog.join()
        for task in queued:
            task.future.cancel()
        for worker in workers:
            with contextlib.suppress(OSError):  # it has ended already
                worker.connection.send(None)
        if workers:
            overdue = threading.Timer(EXIT_GRACE_S, _kill_running, args=(workers,))
            overdue.daemon = True
            overdue.start()
        if wait:
            for worker in ending:
                if worker.collector is not None:
                    worker.collector.join()

    def _enqueue(self, request: _Request) -> Pending[Any]:
        task = _Task(request)
        with self._lock:
            for slot, worker in enumerate(self._workers):
                if worker is None:
                    self._workers[slot] = self._start(slot)
            if self._deadline_s is not None and self._watchdog is None:
                self._released.clear()
                self._watchdog = threading.Thread(
                    target=self._watch,
                    args=(self._deadline_s,),
                    name="loadax-deadline",
                    daemon=True,
                )
                self._watchdog.start()
            self._queue.append(task)
            self._dispatch()
        return FuturePending(task.future)

    def _watch(self, deadline_s: float) -> None:
        """Kill each process that has been loading one item for longer than `deadline_s`."""
        while not self._released.wait(min(deadline_s / 4, 0.25)):
            now = time.monotonic()
            with self._lock:
                overdue = [
                    worker
                    for worker in self._workers
                    if worker is not None
                    and worker.task is not None
                    and worker.stopped_for is None
                    and now - worker.task.started > deadline_s
                ]
                for worker in overdue:
                    worker.stopped_for = (
                        f"ran longer than its deadline of {deadline_s:g} s and was stopped"
                    )
            for worker in overdue:
                worker.process.kill()  # its collector fails the item and replaces it

    def _start(self, slot: int) -> _Worker:
        context = _context()
        ours, theirs = context.Pipe()
        process = context.Process(  # type: ignore[attr-defined]
            target=_serve,
            args=(theirs, self._pipeline_data),
            name=f"loadax-process-{slot}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the pipe ends, so reads fail, as soon as the process ends
        worker = _Worker(slot, process, ours)
        worker.collector = threading.Thread(
            target=self._collect, args=(worker,), name=f"loadax-process-{slot}", daemon=True
        )
        worker.collector.start()
        return worker

    def _dispatch(self) -> None:
        """Hand queued batches to idle processes (the lock is held)."""
        for worker in self._workers:
            if worker is None or worker.task is not None:
                continue
            while self._queue:
                task = self._queue.popleft()
                if task.future.set_running_or_notify_cancel():
                    worker.task = task
                    task.started = time.monotonic()
                    with contextlib.suppress(OSError):  # it died: its collector fails the task
                        worker.connection.send(task.request)
                    break

    def _collect(self, worker: _Worker) -> None:
        """Settle what `worker` loads until its process ends; then clean up after it."""
        failure = None
        try:
            while failure is None:
                failure = self._receive(worker, worker.connection.recv())
        except (EOFError, OSError):
            pass  # the process has ended
        except BaseException as error:
            failure = f"was stopped by an error in loadax: {error!r}"
            raise
        finally:
            self._lost(worker, failure)

    def _receive(self, worker: _Worker, message: tuple[Any, ...]) -> str | None:
        """Act on a message of `worker`; what went wrong if it must be stopped, else None."""
        kind, detail = message
        if kind == "broken":
            return f"could not load the pipeline:\n{detail}"
        if kind == "grow":
            try:
                name = worker.new_segment(detail)
            except OSError as error:
                return f"needed a shared memory segment of {detail} bytes, which failed: {error}"
            worker.connection.send(name)
            return None
        # Copied out before the process may get its next batch, which reuses the segment.
        payload = worker.copy_out(detail) if kind == "done" else None
        with self._lock:
            task, worker.task = worker.task, None
            worker.loaded += 1
            self._dispatch()
        if task is None:
            return f"sent {kind!r} while loading nothing"
        if payload is None:
            task.future.set_exception(detail.rebuild(f"{worker}, loading {task.request}"))
            return None
        try:
            task.future.set_result(payload if self._encoded else decode(payload))
        except CodecError as error:
            task.future.set_exception(error)
        return None

    def _lost(self, worker: _Worker, failure: str | None) -> None:
        """`worker`'s process has ended or must end: fail what it leaves undone."""
        if worker.process.is_alive():  # it is stopped for a failure here
            worker.process.kill()
        worker.process.join()
        worker.drop_segment()
        worker.connection.close()
        why = failure or worker.stopped_for or _exit_reason(worker.process.exitcode)
        reason = f"{worker} {why}"
        with self._lock:
            released = self._workers[worker.slot] is not worker
            if not released:
                self._workers[worker.slot] = None
            loading, worker.task = worker.task, None
            orphans: list[_Task] = []
            proven = worker.loaded or worker.stopped_for is not None
            if not released and self._queue and proven and failure is None:
                # It worked before: what killed it was the item it loaded; the queue goes on.
                self._workers[worker.slot] = self._start(worker.slot)
                self._dispatch()
            elif not released and all(slot is None for slot in self._workers):
                orphans, self._queue = list(self._queue), deque()
        if loading is not None:
            loading.future.set_exception(
                CancelledError()  # the source was released: nobody waits for it
                if released
                else WorkerProcessLost(loading.request.work, reason)
                if failure is None
                else WorkerProcessError(f"{loading.request} was not loaded: {reason}")
            )
        for task in orphans:
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
                task.future.set_exception(
                    WorkerProcessError(
                        f"{task.request} was not loaded, since no worker process is left: {reason}"
                    )
                )


def _exit_reason(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name
    if -code == signal.SIGBUS:
        return f"was killed by {name}: /dev/shm may be too small for its batches"
    return f"was killed by {name}"
