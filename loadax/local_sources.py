"""Local batch sources: loading in the calling thread, or in chunks on a pool of threads.

With threads, each batch is split into one chunk of records per worker so that every worker
helps with every batch; the thread that reads the last chunk collates the batch.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any, Generic

import numpy as np
from typing_extensions import TypeVar

from loadax.engine import BatchSource, FuturePending, Pending
from loadax.permutation import IndexArray
from loadax.pipeline import Pipeline
from loadax.plan import Plan

B = TypeVar("B", default=Any)


class InlineSource(BatchSource[B]):
    """Loads each batch in the calling thread, when it is submitted."""

    def __init__(self, pipeline: Pipeline[Any, B]) -> None:
        self._pipeline = pipeline

    def submit(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[B]:
        done: Future[B] = Future()
        try:
            done.set_result(self._pipeline.load(plan, step, rows))
        except Exception as error:
            done.set_exception(error)
        return FuturePending(done)

    def release(self, wait: bool) -> None:
        """Nothing to release: no threads."""


class ThreadedSource(BatchSource[B]):
    """Reads the records of each batch in `workers` chunks on a thread pool."""

    def __init__(self, pipeline: Pipeline[Any, B], workers: int) -> None:
        self._pipeline, self._workers = pipeline, workers
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[B]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="loadax")
        indices = plan.indices(step, rows)
        return _ChunkedBatch(
            self._pool, self._workers, self._pipeline, step, indices, plan.epoch(step)
        )

    def release(self, wait: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None


class _ChunkedBatch(Generic[B]):
    """One batch being read in chunks by the pool; the last chunk to finish collates it."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        workers: int,
        pipeline: Pipeline[Any, B],
        step: int,
        indices: IndexArray,
        epoch: int,
    ) -> None:
        self._pipeline, self._step, self._epoch = pipeline, step, epoch
        self._batch: Future[B] = Future()
        self._lock = threading.Lock()
        chunks = np.array_split(indices, max(1, min(workers, indices.size)))
        self._parts: list[list[Any]] = [[] for _ in chunks]
        self._chunks_left = len(chunks)
        self._chunk_tasks = [
            pool.submit(self._read_chunk, position, chunk) for position, chunk in enumerate(chunks)
        ]

    def result(self) -> B:
        return self._batch.result()

    def cancel(self) -> None:
        for task in self._chunk_tasks:
            task.cancel()
        # Whoever waits on a dropped batch gets CancelledError instead of waiting forever.
        self._batch.cancel()

    def _read_chunk(self, position: int, chunk: IndexArray) -> None:
        if self._batch.done():  # another chunk failed already
            return
        try:
            part = self._pipeline.read(chunk, self._epoch)
        except BaseException as error:  # anything else would leave the consumer waiting forever
            self._settle(error=error)
            return
        with self._lock:
            self._parts[position] = part
            self._chunks_left -= 1
            if self._chunks_left or self._batch.done():
                return
        records = [record for part in self._parts for record in part]
        try:
            batch = self._pipeline.collate(records, self._step)
        except BaseException as error:
            self._settle(error=error)
            return
        self._settle(batch=batch)

    def _settle(self, batch: Any = None, error: BaseException | None = None) -> None:
        # The batch may have been cancelled meanwhile: then nobody wants the outcome.
        with contextlib.suppress(InvalidStateError):
            if error is None:
                self._batch.set_result(batch)
            else:
                self._batch.set_exception(error)
