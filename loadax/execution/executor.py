"""Executors: where work items load (the calling thread, a pool of threads, processes, workers).

An `Executor` starts loading a work item and hands back a `Pending` result at once; the iterators
keep several in flight and take them in order.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar

from loadax.plan.planner import Plan
from loadax.plan.work import Work

B = TypeVar("B", default=Any)
B_co = TypeVar("B_co", covariant=True, default=Any)


class Pending(Protocol[B_co]):
    """A batch being loaded."""

    def result(self, timeout: float | None = None) -> B_co:
        """The batch, once loaded (blocking without spinning); raises what loading raised, or
        TimeoutError when it is not loaded within `timeout` seconds."""
        ...

    def cancel(self) -> None:
        """Drop the batch: work not yet started is not done."""
        ...


class FuturePending(Generic[B]):
    """A batch that a `concurrent.futures.Future` will hold."""

    def __init__(self, future: Future[B]) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> B:
        return self._future.result(timeout)

    def cancel(self) -> None:
        self._future.cancel()

    def when_done(self, callback: Callable[[FuturePending[B]], None]) -> None:
        """Call `callback` with the batch once it is settled (loaded, failed or cancelled), on
        the thread that settles it, or at once if it is settled: no thread waits for it. The
        future lets go of `callback` once it is called, so that a callback that refers back to
        this batch makes no lasting cycle: one would keep the batch, and the pooled buffers of
        its leaves, until the garbage collector ran."""
        self._future.add_done_callback(_Once(callback))


class _Once(Generic[B]):
    """A future's done-callback that calls `callback` with the settled batch once, then lets
    go of it (a future keeps its done-callbacks as long as it lives)."""

    def __init__(self, callback: Callable[[FuturePending[B]], None]) -> None:
        self._callback: Callable[[FuturePending[B]], None] | None = callback

    def __call__(self, future: Future[B]) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback(FuturePending(future))


class Executor(abc.ABC, Generic[B]):
    """Starts loading work items; holds the threads, processes or connections it takes."""

    @abc.abstractmethod
    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        """Start loading `work`: a batch's rows, or the stacked rows (None: none) of a window."""

    def lookahead(self, prefetch: int) -> int:
        """How many work items to keep submitted for a training loop that asked for `prefetch`
        ahead: that many here; a remote executor adds what keeps every worker busy."""
        return prefetch

    @abc.abstractmethod
    def release(self, wait: bool) -> None:
        """Free threads and connections; a later `submit` acquires them again."""
