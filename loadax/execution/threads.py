"""The thread executor: each work item read in chunks on a pool of threads.

Each batch (or stream window) is split into one chunk of records per thread so that every thread
helps with every batch; the thread that reads the last chunk finishes (collates) it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
from typing_extensions import TypeVar

from loadax.collate.batcher import SharedStack, StackInto
from loadax.execution.executor import Executor, FuturePending, Pending
from loadax.execution.pipeline import Pipeline
from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan
from loadax.plan.work import Work

B = TypeVar("B", default=Any)


class ThreadExecutor(Executor[B]):
    """Reads the records of each work item in `threads` chunks on a thread pool."""

    def __init__(self, pipeline: Pipeline[Any, B], threads: int) -> None:
        self._pipeline, self._threads = pipeline, threads
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, plan: Plan, work: Work, into: StackInto | None = None) -> Pending[Any]:
        """Start loading `work`; a batch that the default batcher stacks goes `into` that
        memory if given (and it takes it)."""
        pipeline = self._pipeline
        if pipeline.reads_rows:  # one vectorised read: nothing to split
            return FuturePending(self._started().submit(pipeline.run, plan, work))
        indices, epochs = pipeline.positions(plan, work)
        chunks = list(zip(self._chunks(indices), self._chunks(epochs), strict=True))
        # Stacking threads copy their own rows into the batch: no serial copy at the end.
        stacks = pipeline.stream is None and pipeline.batcher.stacks
        shared = SharedStack([chunk.size for chunk, _ in chunks], into) if stacks else None

        def finish(records: list[Any]) -> Any:
            batch = None if shared is None else shared.batch()
            if batch is None:
                return pipeline.finish(records, indices, epochs, work)
            return cast(B, batch)

        return _ChunkedBatch(
            self._started(),
            chunks,
            pipeline.read_at,
            finish,
            None if shared is None else shared.place,
        )

    def resize(self, threads: int) -> None:
        """Read each work item submitted from now on with `threads` threads (the chunks already
        queued still run); the batches are the same for any number."""
        if threads != self._threads:
            self._threads = threads
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

    def release(self, wait: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    def _started(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="loadax")
        return self._pool

    def _chunks(self, values: IndexArray) -> list[IndexArray]:
        return np.array_split(values, max(1, min(self._threads, values.size)))


class _ChunkedBatch(FuturePending[B]):
    """One batch being read in chunks by the pool; the last chunk to finish collates it.

    A chunk that fails fails the batch once no other chunk of it runs (those not started yet
    are skipped): the others may be copying their rows into memory that is the batch's user's
    once the batch is done, e.g. a client's memory file, which its worker answers with the
    failure and the client then lends to its next request.
    """

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        chunks: list[tuple[IndexArray, IndexArray]],
        read: Callable[[IndexArray, IndexArray], list[Any]],
        finish: Callable[[list[Any]], B],
        place: Callable[[int, list[Any]], None] | None = None,
    ) -> None:
        super().__init__(Future())
        self._read, self._finish, self._place = read, finish, place
        self._lock = threading.Lock()
        self._parts: list[list[Any]] = [[] for _ in chunks]
        self._chunks_left = len(chunks)
        self._failure: BaseException | None = None  # the first chunk's that failed
        self._chunk_tasks = [
            pool.submit(self._read_chunk, position, *chunk) for position, chunk in enumerate(chunks)
        ]
        # Not a method of this object: a task's callbacks outlive it, and a cycle through them
        # would keep the batch (and the pooled buffers of its leaves) until the garbage collector
        # ran, so that every batch stacked into a fresh buffer, faulted in page by page.
        for task in self._chunk_tasks:
            task.add_done_callback(functools.partial(_cancel_if_cancelled, self._future))

    def cancel(self) -> None:
        for task in self._chunk_tasks:
            task.cancel()
        # Whoever waits on a dropped batch gets CancelledError instead of waiting forever.
        self._future.cancel()

    def _read_chunk(self, position: int, indices: IndexArray, epochs: IndexArray) -> None:
        part: list[Any] = []
        if self._failure is None and not self._future.done():  # else: failed or cancelled
            try:
                part = self._read(indices, epochs)
                if self._place is not None:
                    self._place(position, part)
            except BaseException as error:  # anything else would leave the consumer waiting
                with self._lock:
                    self._failure = self._failure or error
        with self._lock:
            self._parts[position] = part
            self._chunks_left -= 1
            if self._chunks_left or self._future.done():
                return
            failure = self._failure
        if failure is not None:
            self._settle(error=failure)
            return
        records = [record for part in self._parts for record in part]
        try:
            batch = self._finish(records)
        except BaseException as error:
            self._settle(error=error)
            return
        self._settle(batch=batch)

    def _settle(self, batch: Any = None, error: BaseException | None = None) -> None:
        # The batch may have been cancelled meanwhile: then nobody wants the outcome.
        with contextlib.suppress(InvalidStateError):
            if error is None:
                self._future.set_result(batch)
            else:
                self._future.set_exception(error)


def _cancel_if_cancelled(batch: Future[Any], task: Future[None]) -> None:
    """A chunk's `task` that the pool's shutdown cancelled before it ran: its `batch` is never
    finished, so it is cancelled."""
    if task.cancelled():
        batch.cancel()
