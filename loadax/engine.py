"""The iterator every loader shares: ordered, bounded prefetch over a source of batches.

A `BatchSource` starts loading the batch of a step (with local threads, or on a remote worker)
and hands back a `Pending` batch. `BatchIterator` keeps up to `prefetch` of them in flight ahead
of the training loop and yields them in plan order, so what comes out depends only on the plan.
Its state is the next step and the plan: the same for every source.
"""

from __future__ import annotations

import abc
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar

from loadax.permutation import IndexArray
from loadax.plan import Plan
from loadax.sharding import ShardingStrategy
from loadax.stream import StreamWindow

B = TypeVar("B", default=Any)
B_co = TypeVar("B_co", covariant=True, default=Any)

STATE_VERSION = 1


class Pending(Protocol[B_co]):
    """A batch being loaded."""

    def result(self) -> B_co:
        """The batch, once loaded (blocking without spinning); raises what loading raised."""
        ...

    def cancel(self) -> None:
        """Drop the batch: work not yet started is not done."""
        ...


class FuturePending(Generic[B]):
    """A batch that a `concurrent.futures.Future` will hold."""

    def __init__(self, future: Future[B]) -> None:
        self._future = future

    def result(self) -> B:
        return self._future.result()

    def cancel(self) -> None:
        self._future.cancel()


class BatchSource(abc.ABC, Generic[B]):
    """Starts loading batches (or stream windows); holds the threads or connections it takes."""

    @abc.abstractmethod
    def submit(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[B]:
        """Start loading `rows` (None: all) of the batch of `step`."""

    @abc.abstractmethod
    def submit_window(self, plan: Plan, window: StreamWindow) -> Pending[Any]:
        """Start loading the stacked rows (None: no rows) that a window of a stream yields."""

    @abc.abstractmethod
    def release(self, wait: bool) -> None:
        """Free threads and connections; a later `submit` acquires them again."""


class LoaderIterator(Iterator[B], abc.ABC):
    """An iterator over a loader's batches that can be checkpointed, restored and closed.

    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
    >>> with iter(loader) as iterator:
    ...     first = next(iterator).tolist()
    ...     state = iterator.get_state()
    >>> resumed = iter(loader)
    >>> resumed.set_state(state)
    >>> first, [batch.tolist() for batch in resumed]
    ([0, 1], [[2, 3], [4, 5]])
    """

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A small JSON-able dict: restoring it yields exactly the batches that would come next.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6)))
        >>> _ = next(iterator)
        >>> state = iterator.get_state()
        >>> sorted(state), state["step"], state["plan"]["batch_size"]
        (['plan', 'step', 'version'], 1, 2)
        >>> iterator.close()
        """

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a state of `get_state()`; a state of another plan is a ValueError.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2)
        >>> iterator = iter(builder.build(RangeDataset(0, 6)))
        >>> _ = next(iterator)
        >>> iterator.set_state(iterator.get_state())  # restoring moves nothing
        >>> next(iterator).tolist()
        [2, 3]
        >>> shuffled = builder.shuffle(seed=1).build(RangeDataset(0, 6))
        >>> iter(shuffled).set_state(iterator.get_state())  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        ValueError: iterator state belongs to another plan: seed is 0 in the state but 1 in this
        loader; shuffle is False in the state but True in this loader
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Stop loading and release threads; the iterator is exhausted afterwards.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6)))
        >>> next(iterator).tolist()
        [0, 1]
        >>> iterator.close()
        >>> next(iterator, "exhausted")
        'exhausted'
        """

    def __enter__(self) -> LoaderIterator[B]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BatchIterator(LoaderIterator[B]):
    """Yields this process's rows of the batches of `plan`, in plan order, from `source`.

    It is what iterating a local or remote loader gives (without device prefetch):

    >>> from loadax import BatchIterator, Batcher, DataLoader, RangeDataset
    >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4)))
    >>> isinstance(iterator, BatchIterator), [batch.tolist() for batch in iterator]
    (True, [[0, 1], [2, 3]])
    """

    def __init__(
        self, source: BatchSource[B], plan: Plan, sharding: ShardingStrategy, *, prefetch: int
    ) -> None:
        self._source, self._plan, self._sharding = source, plan, sharding
        self._prefetch = prefetch
        self._next_step = 0  # the step the training loop gets next
        self._next_submit = 0  # the first step not yet handed to the source
        self._in_flight: deque[tuple[int, Pending[B]]] = deque()
        self._closed = False
        # Garbage collection of an abandoned iterator releases the source's threads too.
        self._finalizer = weakref.finalize(self, source.release, False)

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
        while len(self._in_flight) < self._prefetch and not self._is_finished(self._next_submit):
            self._submit_next()

    def _submit_next(self) -> None:
        step = self._next_submit
        rows = self._sharding.rows(self._plan.batch_length(step))
        self._in_flight.append((step, self._source.submit(self._plan, step, rows)))
        self._next_submit = step + 1

    def _cancel_in_flight(self) -> None:
        while self._in_flight:
            self._in_flight.popleft()[1].cancel()
        self._next_submit = self._next_step

    def _release(self, wait: bool) -> None:
        self._cancel_in_flight()
        self._source.release(wait)


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
    require_same(saved, expected, "plan")
    step = state["step"]
    total = plan.num_steps
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"iterator state has step {step!r}; it must be an int >= 0")
    if total is not None and step > total:
        raise ValueError(f"iterator state has step {step}, beyond the plan's {total} steps")
    return step


def require_same(saved: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """A ValueError naming every key whose value in a saved state differs from `expected`."""
    differences = [
        f"{key} is {saved.get(key)!r} in the state but {value!r} in this loader"
        for key, value in expected.items()
        if saved.get(key) != value
    ]
    if differences:
        raise ValueError(f"iterator state belongs to another {what}: " + "; ".join(differences))
