"""Local batch sources: loading in the calling thread, or in chunks on a pool of threads.

With threads, each batch (or stream window) is split into one chunk of records per worker so that
every worker helps with every batch; the thread that reads the last chunk collates the batch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any, Generic, cast

import numpy as np
from typing_extensions import TypeVar

from loadax.batcher import SharedStack
from loadax.engine import BatchSource, FuturePending, Pending
from loadax.permutation import IndexArray
from loadax.pipeline import Pipeline
from loadax.plan import Plan
from loadax.stream import StreamWindow

B = TypeVar("B", default=Any)


class InlineSource(BatchSource[B]):
    """Loads each batch in the calling thread, when it is submitted."""

    def __init__(self, pipeline: Pipeline[Any, B]) -> None:
        self._pipeline = pipeline

    def submit(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[B]:
        return _settled(lambda: self._pipeline.load(plan, step, rows))

    def submit_window(self, plan: Plan, window: StreamWindow) -> Pending[Any]:
        return _settled(lambda: self._pipeline.load_window(plan, window))

    def release(self, wait: bool) -> None:
        """Nothing to release: no threads."""


def _settled(load: Callable[[], B]) -> Pending[B]:
    try:
        return _Loaded(load())
    except Exception as error:
        return _Failed(error)


class _Loaded(Generic[B]):
    """A batch loaded already."""

    def __init__(self, batch: B) -> None:
        self._batch = batch

    def result(self) -> B:
        return self._batch

    def cancel(self) -> None:
        """Nothing left to stop."""


class _Failed:
    """A batch whose loading failed: `result()` raises the error."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def result(self) -> Any:
        raise self._error

    def cancel(self) -> None:
        """Nothing left to stop."""


class ThreadedSource(BatchSource[B]):
    """Reads the records of each batch in `workers` chunks on a thread pool."""

    def __init__(self, pipeline: Pipeline[Any, B], workers: int) -> None:
        self._pipeline, self._workers = pipeline, workers
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[B]:
        if self._pipeline.reads_rows:  # one vectorised read: nothing to split
            return FuturePending(self._started().submit(self._pipeline.load, plan, step, rows))
        indices, epoch = plan.indices(step, rows), plan.epoch(step)
        chunks = self._chunks(indices)
        # Stacking threads copy their own rows into the batch: no serial copy at the end.
        stacks = self._pipeline.batcher.stacks
        shared = SharedStack([chunk.size for chunk in chunks]) if stacks else None

        def finish(records: list[Any]) -> B:
            batch = None if shared is None else shared.batch()
            return self._pipeline.collate(records, step) if batch is None else cast(B, batch)

        return _ChunkedBatch(
            self._started(),
            [(chunk, np.full(chunk.size, epoch)) for chunk in chunks],
            self._pipeline.read_at,
            finish,
            None if shared is None else shared.place,
        )

    def submit_window(self, plan: Plan, window: StreamWindow) -> Pending[Any]:
        indices, epochs = self._pipeline.window_records(plan, window)
        return _ChunkedBatch(
            self._started(),
            list(zip(self._chunks(indices), self._chunks(epochs), strict=True)),
            self._pipeline.read_at,
            lambda records: self._pipeline.finish_window(records, indices, epochs, window),
        )

    def release(self, wait: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    def _started(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="loadax")
        return self._pool

    def _chunks(self, values: IndexArray) -> list[IndexArray]:
        return np.array_split(values, max(1, min(self._workers, values.size)))


class _ChunkedBatch(Generic[B]):
    """One batch being read in chunks by the pool; the last chunk to finish collates it."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        chunks: list[tuple[IndexArray, IndexArray]],
        read: Callable[[IndexArray, IndexArray], list[Any]],
        finish: Callable[[list[Any]], B],
        place: Callable[[int, list[Any]], None] | None = None,
    ) -> None:
        self._read, self._finish, self._place = read, finish, place
        self._batch: Future[B] = Future()
        self._lock = threading.Lock()
        self._parts: list[list[Any]] = [[] for _ in chunks]
        self._chunks_left = len(chunks)
        self._chunk_tasks = [
            pool.submit(self._read_chunk, position, *chunk) for position, chunk in enumerate(chunks)
        ]

    def result(self) -> B:
        return self._batch.result()

    def cancel(self) -> None:
        for task in self._chunk_tasks:
            task.cancel()
        # Whoever waits on a dropped batch gets CancelledError instead of waiting forever.
        self._batch.cancel()

    def _read_chunk(self, position: int, indices: IndexArray, epochs: IndexArray) -> None:
        if self._batch.done():  # another chunk failed already
            return
        try:
            part = self._read(indices, epochs)
            if self._place is not None:
                self._place(position, part)
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
            batch = self._finish(records)
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
