"""The iterator of a random-access loader: ordered, bounded prefetch over an executor.

`BatchIterator` keeps the executor's lookahead of steps (`prefetch`, or more for a remote
executor that keeps every worker busy) in flight ahead of the training loop and yields them in
plan order, so what comes out depends only on the plan. Its state is the next step and the plan:
the same for every executor.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

from typing_extensions import TypeVar

from loadax.delivery.sharding import ShardingStrategy
from loadax.execution.executor import Executor, Pending
from loadax.iterators.base import LoaderIterator
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork
from loadax.state.checks import STATE_VERSION, checked_step

B = TypeVar("B", default=Any)


class BatchIterator(LoaderIterator[B]):
    """Yields this process's rows of the batches of `plan`, in plan order, from `executor`.

    It is what iterating a local or remote loader gives (without device prefetch):

    >>> from loadax import BatchIterator, Batcher, DataLoader, RangeDataset
    >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4)))
    >>> isinstance(iterator, BatchIterator), [batch.tolist() for batch in iterator]
    (True, [[0, 1], [2, 3]])
    """

    def __init__(
        self, executor: Executor[B], plan: Plan, sharding: ShardingStrategy, *, prefetch: int
    ) -> None:
        self._executor, self._plan, self._sharding = executor, plan, sharding
        self._prefetch = prefetch
        self._next_step = 0  # the step the training loop gets next
        self._next_submit = 0  # the first step not yet handed to the executor
        self._in_flight: deque[tuple[int, Pending[B]]] = deque()
        self._closed = False
        # Garbage collection of an abandoned iterator releases the executor's threads too.
        self._finalizer = weakref.finalize(self, executor.release, False)

    def __next__(self) -> B:
        if self._closed or self._is_finished(self._next_step):
            self._release(wait=False)
            raise StopIteration
        self._fill_window()
        if not self._in_flight:  # no prefetch: load the current step now
            self._submit_next()
        step, pending = self._in_flight.popleft()
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
        self._release(wait=True)

    def _is_finished(self, step: int) -> bool:
        total = self._plan.num_steps
        return total is not None and step >= total

    def _fill_window(self) -> None:
        ahead = self._executor.lookahead(self._prefetch)
        while len(self._in_flight) < ahead and not self._is_finished(self._next_submit):
            self._submit_next()

    def _submit_next(self) -> None:
        step = self._next_submit
        rows = self._sharding.rows(self._plan.batch_length(step))
        self._in_flight.append((step, self._executor.submit(self._plan, StepWork(step, rows))))
        self._next_submit = step + 1

    def _cancel_in_flight(self) -> None:
        while self._in_flight:
            self._in_flight.popleft()[1].cancel()
        self._next_submit = self._next_step

    def _release(self, wait: bool) -> None:
        self._cancel_in_flight()
        self._executor.release(wait)
