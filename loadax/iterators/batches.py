"""The iterator of a random-access loader: ordered, bounded prefetch over an executor.

`BatchIterator` keeps the executor's lookahead of steps (`prefetch`, or more for a remote
executor that keeps every worker busy) in flight ahead of the training loop and yields them in
plan order, so what comes out depends only on the plan. Its state is the next step, the plan and
the pipeline's fingerprint: the same for every executor. An iterator of one epoch
(`Loader.epoch(e)`) yields that epoch's steps of the plan, and its state names the epoch too.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from typing_extensions import TypeVar

from loadax.delivery.sharding import ShardingStrategy
from loadax.execution.executor import Executor, Pending
from loadax.iterators.base import LoaderIterator
from loadax.iterators.passes import Passes
from loadax.iterators.stats import StatsRecorder
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork
from loadax.state.checks import (
    STATE_VERSION,
    check_fingerprint,
    checked_epoch_step,
    checked_plan_step,
    restored,
)

B = TypeVar("B", default=Any)


class BatchIterator(LoaderIterator[B]):
    """Yields this process's rows of the batches of `plan`, in plan order, from `executor`.

    It is what iterating a local or remote loader gives (without device prefetch). With
    `epoch`, it yields the steps of that epoch only (`plan.epoch_steps(epoch)`), past the
    plan's `num_epochs` too. `stats` counts what the training loop got and waited for (with
    `counts_loop` False, only the sizes of the batches: the iterator over this one counts what
    the loop takes); `passes` hears when the iterator has run through the whole plan from step
    0, unrestored. `fingerprint` gives the pipeline's fingerprint, which the state records and
    `set_state` checks (None: neither).

    >>> from loadax import BatchIterator, Batcher, DataLoader, RangeDataset
    >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4)))
    >>> isinstance(iterator, BatchIterator), [batch.tolist() for batch in iterator]
    (True, [[0, 1], [2, 3]])
    """

    def __init__(
        self,
        executor: Executor[B],
        plan: Plan,
        sharding: ShardingStrategy,
        *,
        prefetch: int,
        epoch: int | None = None,
        stats: StatsRecorder | None = None,
        counts_loop: bool = True,
        passes: Passes | None = None,
        fingerprint: Callable[[], str] | None = None,
    ) -> None:
        self._executor, self._sharding = executor, sharding
        self._loader_plan = plan  # what a restored state is checked against
        self._fingerprint = fingerprint
        self._prefetch = prefetch
        self._epoch = epoch
        first = self._follow(plan)
        self._next_step = first  # the step the training loop gets next
        self._next_submit = first  # the first step not yet handed to the executor
        self._in_flight: deque[tuple[int, Pending[B]]] = deque()
        self._closed = False
        recorder = StatsRecorder() if stats is None else stats
        self._counts = recorder.counts(self, loop=counts_loop)
        self._passes = passes if epoch is None else None  # None once it cannot make a pass
        # Garbage collection of an abandoned iterator releases the executor's threads too.
        self._finalizer = weakref.finalize(self, executor.release, False)

    def __next__(self) -> B:
        counts = self._counts
        started = counts.clock()  # the loop waits from here to the return
        try:
            batch = self._next_batch()
        except BaseException:
            counts.counted(started)
            raise
        counts.counted(started, batch)
        return batch

    @property
    def step(self) -> int:
        return self._next_step

    @property
    def epoch(self) -> int:
        if self._epoch is not None:
            return self._epoch
        return self._plan.position(self._next_step).epoch

    def get_state(self) -> dict[str, Any]:
        step = self._next_step
        state = {
            "version": STATE_VERSION,
            "step": step,
            "plan": self._plan.describe(),
            "position": self._work_plan.position(step).describe(),
        }
        if self._epoch is not None:
            state["epoch"] = self._epoch
        if self._fingerprint is not None:
            state["fingerprint"] = self._fingerprint()
        return state

    def set_state(
        self,
        state: dict[str, Any],
        *,
        allow_new_pipeline: bool = False,
        allow_new_batch_size: bool = False,
    ) -> None:
        if self._epoch is None:
            plan, step = checked_plan_step(state, self._loader_plan, allow_new_batch_size)
        else:
            plan, step = restored(state, self._loader_plan, allow_new_batch_size)
            checked_epoch_step(state, plan, self._epoch)
        if self._fingerprint is not None:
            check_fingerprint(state, self._fingerprint, allow_new_pipeline)
        if plan is not self._plan:
            for length in plan.batch_lengths():
                self._sharding.check_batch_length(length, "a batch of the resumed plan")
        self._follow(plan)
        self._next_step = step
        self._cancel_in_flight()
        self._passes = None  # a resumed run is no full pass

    def close(self) -> None:
        self._closed = True
        self._release(wait=True)

    def _next_batch(self) -> B:
        if self._closed or self._is_finished(self._next_step):
            if not self._closed and self._passes is not None:
                passes, self._passes = self._passes, None
                passes.finished(stacklevel=3)
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

    def _follow(self, plan: Plan) -> int:
        """Yield the steps of `plan` (of its epoch, for an iterator of one); the first of them."""
        self._plan = plan
        if self._epoch is None:
            self._work_plan, self._stop = plan, plan.num_steps
            return plan.first_step
        steps = plan.epoch_steps(self._epoch)
        # The same records for every step: the loader's plan only ends sooner.
        self._work_plan, self._stop = plan.extended_to(self._epoch), steps.stop
        return steps.start

    def _is_finished(self, step: int) -> bool:
        return self._stop is not None and step >= self._stop

    def _fill_window(self) -> None:
        ahead = self._executor.lookahead(self._prefetch)
        while len(self._in_flight) < ahead and not self._is_finished(self._next_submit):
            self._submit_next()

    def _submit_next(self) -> None:
        step, plan = self._next_submit, self._work_plan
        rows = self._sharding.rows(plan.batch_length(step))
        self._in_flight.append((step, self._executor.submit(plan, StepWork(step, rows))))
        self._next_submit = step + 1

    def _cancel_in_flight(self) -> None:
        while self._in_flight:
            self._in_flight.popleft()[1].cancel()
        self._next_submit = self._next_step

    def _release(self, wait: bool) -> None:
        self._cancel_in_flight()
        self._executor.release(wait)
