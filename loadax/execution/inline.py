"""The inline executor: each work item loads in the calling thread, when it is submitted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic

from typing_extensions import TypeVar

from loadax.execution.executor import Executor, Pending
from loadax.execution.pipeline import Pipeline
from loadax.plan.planner import Plan
from loadax.plan.work import Work

B = TypeVar("B", default=Any)


class InlineExecutor(Executor[B]):
    """Loads each work item in the calling thread, when it is submitted."""

    def __init__(self, pipeline: Pipeline[Any, B]) -> None:
        self._pipeline = pipeline

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        return _settled(lambda: self._pipeline.run(plan, work))

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

    def result(self, timeout: float | None = None) -> B:
        del timeout  # loaded already
        return self._batch

    def cancel(self) -> None:
        """Nothing left to stop."""


class _Failed:
    """A batch whose loading failed: `result()` raises the error."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def result(self, timeout: float | None = None) -> Any:
        del timeout  # failed already
        raise self._error

    def cancel(self) -> None:
        """Nothing left to stop."""
