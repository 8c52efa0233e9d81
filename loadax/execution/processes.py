"""The process executor: whole batches (and stream windows) loaded in loader processes.

Threads cannot run transforms that hold the GIL in parallel; processes can. The pipeline is
pickled once, when the loader is built, and unpickled by each loader process, which the
forkserver starts (never a plain fork of the trainer: its JAX runtime is multithreaded). The
forkserver preloads `loadax`, so a process starts in milliseconds rather than importing JAX anew;
JAX in a loader process runs on the CPU, so that it never takes the trainer's accelerators.

What a process runs is `process_child`; the parent's handle on it, with the shared memory that
batches come back through, is `process_handle`. The parent copies each batch out (one memcpy) into
a buffer it reuses once nothing decoded from it is alive (`loadax.buffers`: a fresh one of tens
of MiB per batch is faulted in page by page, which cost more than the copy and the loading
together: W2's images from 2 processes, 9,300 faults a batch) and decodes it.

A loader's processes are shared by its iterators (`SharedProcesses`): they live across epochs
and iterators until the loader is closed or collected, each iterator dropping only its own work.

With a deadline, a process that runs one work item longer is killed and its item fails with
`WorkerProcessLost`, like one whose process died; a new process takes the slot. With `encoded`,
the parent hands out the encoding itself (for a loadax-worker, which sends it on unchanged).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
import time
import weakref
from collections import deque
from concurrent.futures import CancelledError, InvalidStateError
from multiprocessing import context as mp_context
from multiprocessing import get_context
from typing import Any, Generic

from typing_extensions import TypeVar

from loadax.buffers import BufferPool
from loadax.execution.executor import Executor, FuturePending, Pending
from loadax.execution.pickled import PickledPipeline
from loadax.execution.process_child import ChildRequest, serve
from loadax.execution.process_errors import WorkerProcessError, WorkerProcessLost
from loadax.execution.process_handle import LoaderProcess, Task, exit_reason, kill_running
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.codec import CodecError, decode

# The errors are imported from here by the worker and by users, as before they had a file.
__all__ = [
    "EXIT_GRACE_S",
    "ProcessExecutor",
    "SharedProcesses",
    "WorkerProcessError",
    "WorkerProcessLost",
]

B = TypeVar("B", default=Any)

EXIT_GRACE_S = 2.0
"""How long a released loader process may take to finish its item and exit before it is killed."""
_PRELOAD = ["__main__", "loadax"]  # the forkserver's default, and loadax with its JAX import


@functools.cache
def _context() -> mp_context.BaseContext:
    context = get_context("forkserver")
    # Only heeded before the forkserver starts, which is what the first call here precedes.
    context.set_forkserver_preload(_PRELOAD)
    return context


_EXECUTORS: weakref.WeakSet[ProcessExecutor[Any]] = weakref.WeakSet()


@atexit.register  # after multiprocessing's own exit handler, so it runs before it
def _release_at_exit() -> None:
    """Let the loader processes end normally (multiprocessing's exit would terminate them)."""
    for executor in list(_EXECUTORS):
        executor.release(wait=True)


class ProcessExecutor(Executor[B]):
    """Loads whole batches (and stream windows) in `processes` processes, several in parallel.

    Batches wait in a queue of the parent until a process is free, so a cancelled one that has
    not started is never loaded. A process that dies, or loads one item for longer than
    `deadline_s` seconds (then it is killed), fails that item with `WorkerProcessLost`. A new
    process takes its place at once if it had loaded an item before; else (it may not be able to
    start at all) the queued items fail too when no process is left, and the next `submit` starts
    new ones. With `encoded`, results are the encoding of each batch (a writable `memoryview`
    that `loadax.wire.codec.decode` reads, reused once nothing refers to it), not the batch.
    """

    def __init__(
        self,
        pipeline: PickledPipeline[B],
        processes: int,
        *,
        deadline_s: float | None = None,
        encoded: bool = False,
    ) -> None:
        self._pipeline_data, self._slots = pipeline.data, processes
        self._deadline_s, self._encoded = deadline_s, encoded
        self._buffers = BufferPool()
        # Reentrant: a finalizer's release() may run in a thread that holds it.
        self._lock = threading.RLock()
        self._children: list[LoaderProcess | None] = [None] * processes
        self._queue: deque[Task] = deque()
        self._watchdog: threading.Thread | None = None
        self._released = threading.Event()
        self._ending: list[LoaderProcess] = []  # released, maybe still finishing an item
        _EXECUTORS.add(self)

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        return self._enqueue(Task(ChildRequest(plan, work)))

    def submit_for(self, owner: object, plan: Plan, work: Work) -> Pending[Any]:
        """`submit`, noting `owner` for `cancel_queued`."""
        return self._enqueue(Task(ChildRequest(plan, work), owner=owner))

    def grow(self, processes: int) -> None:
        """Load with `processes` processes (if more than now); the new ones start with the next
        `submit`."""
        with self._lock:
            if processes > self._slots:
                self._children += [None] * (processes - self._slots)
                self._slots = processes

    def cancel_queued(self, owner: object) -> None:
        """Cancel the items `owner` submitted that no process has taken yet; the processes, and
        the items they load, carry on."""
        with self._lock:
            queued = [task for task in self._queue if task.owner is owner]
            self._queue = deque(task for task in self._queue if task.owner is not owner)
        for task in queued:
            task.future.cancel()

    def release(self, wait: bool) -> None:
        """Stop the processes: each exits once it has finished the item it loads, so that what
        user code made in it is cleaned up (a `datasets` import's semaphores, say), and is killed
        if that takes longer than `EXIT_GRACE_S`. Queued batches are cancelled, loading ones
        dropped; with `wait`, return once every process has ended."""
        with self._lock:
            children = [child for child in self._children if child is not None]
            self._children = [None] * self._slots
            queued, self._queue = self._queue, deque()
            watchdog, self._watchdog = self._watchdog, None
            self._released.set()
            self._ending = [child for child in self._ending if child.process.is_alive()]
            self._ending += children
            ending = list(self._ending)
        if watchdog is not None:
            watchdog.join()
        for task in queued:
            task.future.cancel()
        for child in children:
            with contextlib.suppress(OSError):  # it has ended already
                child.connection.send(None)
        if children:
            overdue = threading.Timer(EXIT_GRACE_S, kill_running, args=(children,))
            overdue.daemon = True
            overdue.start()
        if wait:
            for child in ending:
                if child.collector is not None:
                    child.collector.join()

    def _enqueue(self, task: Task) -> Pending[Any]:
        with self._lock:
            for slot, child in enumerate(self._children):
                if child is None:
                    self._children[slot] = self._start(slot)
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
                    child
                    for child in self._children
                    if child is not None
                    and child.task is not None
                    and child.stopped_for is None
                    and now - child.task.started > deadline_s
                ]
                for child in overdue:
                    child.stopped_for = (
                        f"ran longer than its deadline of {deadline_s:g} s and was stopped"
                    )
            for child in overdue:
                child.process.kill()  # its collector fails the item and replaces it

    def _start(self, slot: int) -> LoaderProcess:
        context = _context()
        ours, theirs = context.Pipe()
        process = context.Process(  # type: ignore[attr-defined]
            target=serve,
            args=(theirs, self._pipeline_data),
            name=f"loadax-process-{slot}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the pipe ends, so reads fail, as soon as the process ends
        child = LoaderProcess(slot, process, ours)
        child.collector = threading.Thread(
            target=self._collect, args=(child,), name=f"loadax-process-{slot}", daemon=True
        )
        child.collector.start()
        return child

    def _dispatch(self) -> None:
        """Hand queued batches to idle processes (the lock is held)."""
        for child in self._children:
            if child is None or child.task is not None:
                continue
            while self._queue:
                task = self._queue.popleft()
                if task.future.set_running_or_notify_cancel():
                    child.task = task
                    task.started = time.monotonic()
                    with contextlib.suppress(OSError):  # it died: its collector fails the task
                        child.connection.send(task.request)
                    break

    def _collect(self, child: LoaderProcess) -> None:
        """Settle what `child` loads until its process ends; then clean up after it."""
        failure = None
        try:
            while failure is None:
                failure = self._receive(child, child.connection.recv())
        except (EOFError, OSError):
            pass  # the process has ended
        except BaseException as error:
            failure = f"was stopped by an error in loadax: {error!r}"
            raise
        finally:
            self._lost(child, failure)

    def _receive(self, child: LoaderProcess, message: tuple[Any, ...]) -> str | None:
        """Act on a message of `child`; what went wrong if it must be stopped, else None."""
        kind, detail = message
        if kind == "broken":
            return f"could not load the pipeline:\n{detail}"
        if kind == "grow":
            try:
                name = child.new_segment(detail)
            except OSError as error:
                return f"needed a shared memory segment of {detail} bytes, which failed: {error}"
            child.connection.send(name)
            return None
        # Copied out before the process may get its next batch, which reuses the segment.
        payload = child.copy_out(detail, self._buffers) if kind == "done" else None
        with self._lock:
            task, child.task = child.task, None
            child.loaded += 1
            self._dispatch()
        if task is None:
            return f"sent {kind!r} while loading nothing"
        # The task is off the process now: whatever happens, it is settled here.
        try:
            if payload is None:
                task.future.set_exception(detail.rebuild(f"{child}, loading {task.request}"))
            else:
                task.future.set_result(payload if self._encoded else decode(payload))
        except CodecError as error:
            task.future.set_exception(error)
        except Exception as error:
            task.future.set_exception(
                WorkerProcessError(f"{task.request}: what {child} sent back failed: {error!r}")
            )
        return None

    def _lost(self, child: LoaderProcess, failure: str | None) -> None:
        """`child`'s process has ended or must end: fail what it leaves undone."""
        if child.process.is_alive():  # it is stopped for a failure here
            child.process.kill()
        child.process.join()
        child.drop_segment()
        child.connection.close()
        why = failure or child.stopped_for or exit_reason(child.process.exitcode)
        reason = f"{child} {why}"
        with self._lock:
            released = self._children[child.slot] is not child
            if not released:
                self._children[child.slot] = None
            loading, child.task = child.task, None
            orphans: list[Task] = []
            proven = child.loaded or child.stopped_for is not None
            if not released and self._queue and proven and failure is None:
                # It worked before: what killed it was the item it loaded; the queue goes on.
                self._children[child.slot] = self._start(child.slot)
                self._dispatch()
            elif not released and all(slot is None for slot in self._children):
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
                        f"{task.request} was not loaded, since no loader process is left: {reason}"
                    )
                )


class SharedProcesses(Generic[B]):
    """A loader's `ProcessExecutor`, shared by its iterators: its processes start with the first
    batch asked for and stay up across epochs and iterators (no start-up, no unpickling of the
    pipeline again) until `close()`, or until the loader is collected and no iterator of it is
    still open. Each iterator's `lease()` drops only its own queued work when it ends."""

    def __init__(self, pipeline: PickledPipeline[B], processes: int) -> None:
        self.executor = ProcessExecutor(pipeline, processes)
        self.closed = False
        self._lock = threading.Lock()
        self._open: set[_Lease[B]] = set()  # leases not released
        self._owned = True  # the loader lives: it may ask for more iterators

    def lease(self) -> Executor[B]:
        """The executor of one iterator; the processes stay up while it is open."""
        return _Lease(self)

    def disown(self) -> None:
        """The loader is gone: stop the processes once no iterator of it is open."""
        with self._lock:
            self._owned = False
            idle = not self._open
        if idle:
            self.executor.release(wait=False)

    def close(self) -> None:
        """Stop the processes (see `ProcessExecutor.release`); iterators still loading fail."""
        self.closed = True
        self.executor.release(wait=True)

    def opened(self, lease: _Lease[B]) -> None:
        """`lease` submits work: the processes stay up until it is released."""
        if self.closed:
            raise ValueError("the loader is closed: its processes are gone; build it again")
        with self._lock:
            self._open.add(lease)

    def released(self, lease: _Lease[B]) -> None:
        """`lease`'s iterator has ended: drop its queued work, and the processes if it was the
        last open lease of a loader that is gone."""
        with self._lock:
            self._open.discard(lease)
            idle = not self._owned and not self._open
        self.executor.cancel_queued(lease)
        if idle:
            self.executor.release(wait=False)


class _Lease(Executor[B]):
    """One iterator's use of a loader's shared processes: open from its first submit until its
    release (an iterator releases its executor when it ends, is closed or is collected)."""

    def __init__(self, shared: SharedProcesses[B]) -> None:
        self._shared = shared

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        self._shared.opened(self)
        return self._shared.executor.submit_for(self, plan, work)

    def release(self, wait: bool) -> None:
        """Cancel this iterator's queued work; the processes stay for the loader's next one."""
        del wait  # what a process loads for it is dropped when done: nothing to wait for
        self._shared.released(self)
