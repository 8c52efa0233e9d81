"""The executors of a local loader: what each new iterator of a `DataLoader`'s loader loads with.

The calling thread (`workers(0)`), a pool of threads per iterator, or the loader's processes,
shared by its iterators; with autotune, as many threads or processes and as far ahead as the
loader's `Autotuner` says.
"""

from __future__ import annotations

from typing import Any, Generic

from typing_extensions import TypeVar

from loadax.execution.autotune import AutotunedExecutor, Autotuner, Limits, usable_cores
from loadax.execution.executor import Executor
from loadax.execution.heap import keep_freed_memory
from loadax.execution.inline import InlineExecutor
from loadax.execution.pickled import PickledPipeline
from loadax.execution.pipeline import Pipeline
from loadax.execution.processes import SharedProcesses
from loadax.execution.threads import ThreadExecutor
from loadax.iterators.stats import StatsRecorder
from loadax.options import DEFAULT_PREFETCH, LoaderOptions

B = TypeVar("B", default=Any)

THREADS_PER_CORE = 8
"""Autotune's most threads per core: threads waiting on storage leave their core to others (and
the tuner stops adding threads that do not speed loading up)."""


class LocalExecutors(Generic[B]):
    """Makes the executor of each new iterator of a local loader of `pipeline`; autotune's
    choices go to `stats`."""

    def __init__(
        self, pipeline: Pipeline[Any, B], options: LoaderOptions, stats: StatsRecorder
    ) -> None:
        self._pipeline, self._workers = pipeline, options.concurrency
        self.processes = (
            SharedProcesses(PickledPipeline(pipeline), self._workers)
            if options.loading_kind == "processes"
            else None
        )
        if self.processes is None:  # this process loads: it keeps what a batch freed
            keep_freed_memory(arenas=None)
        # Each process loads whole batches: keep every one of them busy.
        default = (
            DEFAULT_PREFETCH if self.processes is None else max(DEFAULT_PREFETCH, self._workers)
        )
        self.prefetch = 0 if self._workers == 0 else options.prefetch or default
        self._tuner: Autotuner | None = None
        if options.autotune_workers or options.autotune_prefetch:
            cores = usable_cores()
            limits = Limits(
                max_workers=cores if self.processes else THREADS_PER_CORE * cores,
                memory_bytes=options.memory_budget_mb << 20,
                processes=self.processes is not None,
                workers=options.autotune_workers,
                # A depth left at its default follows the workers it keeps busy.
                prefetch=options.autotune_prefetch or options.prefetch is None,
            )
            self._tuner = Autotuner(limits, self._workers, self.prefetch, stats.tuned)

    def __call__(self) -> Executor[B]:
        """The executor of a new iterator."""
        tuner = self._tuner
        workers = self._workers if tuner is None else tuner.workers
        if self.processes is not None:
            executor = self.processes.lease()
            grow = self.processes.executor.grow
            return executor if tuner is None else AutotunedExecutor(executor, tuner, grow)
        if workers == 0:
            return InlineExecutor(self._pipeline)
        threads = ThreadExecutor(self._pipeline, workers)
        return threads if tuner is None else AutotunedExecutor(threads, tuner, threads.resize)
