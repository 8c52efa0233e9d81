"""The executor a worker loads a pipeline's batches on: threads, or child processes (the local
loader's `ProcessExecutor`) that rebuild the pipeline from its pickle."""

from __future__ import annotations

from typing import Any

from loadax.execution.executor import Executor
from loadax.execution.pickled import PickledPipeline
from loadax.execution.pipeline import Pipeline
from loadax.execution.processes import ProcessExecutor
from loadax.execution.threads import ThreadExecutor


def pipeline_executor(
    name: str,
    pipeline: Pipeline[Any, Any],
    rebuilt: PickledPipeline[Any] | None,
    threads: int,
    processes: int,
    deadline_s: float,
) -> Executor[Any]:
    """Pipeline `name`'s executor: `threads` threads, or `processes` child processes (each batch
    given up as poison after `deadline_s`) that load `rebuilt` (or `pipeline`, pickled now: a
    `ValueError` naming the pipeline and the part that cannot be pickled)."""
    if not processes:
        return ThreadExecutor(pipeline, threads)
    if rebuilt is None:
        try:
            rebuilt = PickledPipeline(pipeline)
        except ValueError as error:
            raise ValueError(f"pipeline {name!r}: {error}") from None
    return ProcessExecutor(rebuilt, processes, deadline_s=deadline_s, encoded=True)
