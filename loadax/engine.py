"""The local engine: a checkpointable iterator over a plan's batches, with ordered prefetch.

With workers, each batch is split into one chunk of records per worker so that every worker
helps with every batch; the thread that reads the last chunk collates the batch. At most
`prefetch` batches are in flight ahead of the training loop, and batches always come out in plan
order, so the output does not depend on the number of workers.
"""

from __future__ import annotations

import abc
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic

import numpy as np
from typing_extensions import TypeVar

from loadax.permutation import IndexArray
from loadax.pipeline import Pipeline
from loadax.plan import Plan
from loadax.sharding import ShardingStrategy

B = TypeVar("B", default=Any)

STATE_VERSION = 1


class LoaderIterator(Iterator[B], abc.ABC):
    """An iterator over a loader's batches that can be checkpointed, restored and closed."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A small JSON-able dict: restoring it yields exactly the batches that would come next."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a state of `get_state()`; a state of another plan is a ValueError."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop loading and release threads; the iterator is exhausted afterwards."""

    def __enter__(self) -> LoaderIterator[B]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BatchIterator(LoaderIterator[B]):
    """Yields this process's rows of the batches of `plan`, in plan order, prefetched by threads."""

    def __init__(
        self,
        pipeline: Pipeline[Any, B],
        plan: Plan,
        sharding: ShardingStrategy,
        *,
        workers: int,
        prefetch: int,
    ) -> None:
        self._pipeline, self._plan, self._sharding = pipeline, plan, sharding
        self._workers, self._prefetch = workers, prefetch
        self._next_step = 0  # the step the training loop gets next
        self._next_submit = 0  # the first step not yet handed to the pool
        self._in_flight: deque[_PendingBatch[B]] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    def __next__(self) -> B:
        if self._closed or self._is_finished(self._next_step):
            self._release_threads()
            raise StopIteration
        step = self._next_step
        if self._workers == 0:
            batch = self._pipeline.load(self._plan, step, self._rows(step))
        else:
            self._fill_window()
            pending = self._in_flight.popleft()
            self._fill_window()
            try:
                batch = pending.result()
            except BaseException:
                # The state still points at the failed step: a next() or a restore retries it.
                self._cancel_in_flight()
                raise
        self._next_step = step + 1
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "step": self._next_step, "plan": self._plan.describe()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._next_step = checked_step(state, self._plan)
        self._cancel_in_flight()

    def close(self) -> None:
        self._closed = True
        self._release_threads(wait=True)

    def _rows(self, step: int) -> IndexArray | None:
        return self._sharding.rows(self._plan.batch_length(step))

    def _is_finished(self, step: int) -> bool:
        total = self._plan.num_steps
        return total is not None and step >= total

    def _fill_window(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="loadax")
            # Garbage collection of an abandoned iterator releases its threads too.
            self._finalizer = weakref.finalize(self, _shutdown, self._pool)
        while len(self._in_flight) < self._prefetch and not self._is_finished(self._next_submit):
            step = self._next_submit
            indices = self._plan.indices(step, self._rows(step))
            epoch = self._plan.epoch(step)
            self._in_flight.append(
                _PendingBatch(self._pool, self._workers, self._pipeline, step, indices, epoch)
            )
            self._next_submit = step + 1

    def _cancel_in_flight(self) -> None:
        while self._in_flight:
            self._in_flight.popleft().cancel()
        self._next_submit = self._next_step

    def _release_threads(self, wait: bool = False) -> None:
        self._cancel_in_flight()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._pool is not None:
            _shutdown(self._pool, wait=wait)
            self._pool = None


def _shutdown(pool: ThreadPoolExecutor, wait: bool = False) -> None:
    pool.shutdown(wait=wait, cancel_futures=True)


def checked_step(state: Any, plan: Plan) -> int:
    """The step of an iterator state, after checking the state belongs to `plan`."""
    if not isinstance(state, dict):
        raise ValueError(f"iterator state must be a dict, got {type(state).__name__}")
    missing = {"version", "step", "plan"} - state.keys()
    if missing:
        raise ValueError(f"iterator state lacks {sorted(missing)}: got keys {sorted(state)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"iterator state has version {state['version']!r}; this loadax reads {STATE_VERSION}"
        )
    expected = plan.describe()
    saved = state["plan"]
    if not isinstance(saved, dict):
        raise ValueError(f"iterator state has plan {saved!r}; it must be a dict")
    differences = [
        f"{key} is {saved.get(key)!r} in the state but {value!r} in this loader"
        for key, value in expected.items()
        if saved.get(key) != value
    ]
    if differences:
        raise ValueError("iterator state belongs to another plan: " + "; ".join(differences))
    step = state["step"]
    total = plan.num_steps
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"iterator state has step {step!r}; it must be an int >= 0")
    if total is not None and step > total:
        raise ValueError(f"iterator state has step {step}, beyond the plan's {total} steps")
    return step


class _PendingBatch(Generic[B]):
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
        self.step = step
        self._pipeline, self._epoch = pipeline, epoch
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

    def _read_chunk(self, position: int, chunk: IndexArray) -> None:
        if self._batch.done():  # another chunk failed already
            return
        try:
            part = self._pipeline.read(chunk, self._epoch)
        except BaseException as error:  # anything else would leave the consumer waiting forever
            with self._lock:
                if not self._batch.done():
                    self._batch.set_exception(error)
            return
        with self._lock:
            self._parts[position] = part
            self._chunks_left -= 1
            if self._chunks_left or self._batch.done():
                return
        records = [record for part in self._parts for record in part]
        try:
            self._batch.set_result(self._pipeline.collate(records, self.step))
        except BaseException as error:
            self._batch.set_exception(error)
