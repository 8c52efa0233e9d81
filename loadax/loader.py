"""`DataLoader`: the builder of a local loader; it builds a `Loader` (`loadax.built_loader`)."""

from __future__ import annotations

from typing import Any, Generic, Literal, Self

from typing_extensions import TypeVar

from loadax.builder import LoaderBuilder
from loadax.built_loader import Loader
from loadax.collate.batcher import Batcher
from loadax.dataset.names import dataset_repr
from loadax.dataset.protocol import Dataset
from loadax.dataset.stream import Stream
from loadax.execution.local import LocalExecutors
from loadax.execution.pipeline import Pipeline
from loadax.iterators.stats import StatsRecorder
from loadax.options import DEFAULT_CONCURRENCY, DEFAULT_PREFETCH, LoaderOptions, LoadingKind

# Imported from here by the client and the benchmarks, as before the options had a file.
__all__ = ["DEFAULT_PREFETCH", "DataLoader", "Loader", "LoaderBuilder", "LoaderOptions"]

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)


class DataLoader(LoaderBuilder, Generic[T, B]):
    """Builds a `Loader`: `DataLoader(batcher).batch_size(n).workers(k).build(dataset)`.

    Every method returns a new builder, so a partly configured builder can be shared.

    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> batches = DataLoader(Batcher()).batch_size(4)
    >>> [batch.tolist() for batch in batches.build(RangeDataset(0, 10))]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> [batch.tolist() for batch in batches.drop_remainder().build(RangeDataset(0, 10))]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> batches.workers(4)
    DataLoader(Batcher()).batch_size(4).workers(4)
    """

    def __init__(self, batcher: Batcher[T, B], options: LoaderOptions | None = None) -> None:
        if not isinstance(batcher, Batcher):
            raise ValueError(f"batcher must be a loadax.Batcher, got {type(batcher).__name__}")
        super().__init__(options)
        self._batcher = batcher

    def _repr_head(self) -> str:
        return f"DataLoader({self._batcher!r})"

    def workers(self, count: int | Literal["auto"], kind: LoadingKind = "threads") -> Self:
        """This loader's loading threads (or processes); 0 loads in the calling thread. Default 1.

        They are the trainer's own (the method keeps loadax 0.2's name), not loadax-workers.
        Threads split each batch between them: best when the work releases the GIL (numpy,
        I/O). With `kind="processes"`, each process loads whole batches, several at once: for
        Python transforms that hold the GIL. The pipeline is pickled when the loader is built,
        so its functions must be defined at module level, and batches come back through shared
        memory, so they must be what `loadax.wire.codec` encodes (dicts, lists, tuples of arrays).
        With processes, `prefetch` defaults to at least `count`; the processes start with the
        first batch and serve every epoch and iterator of the loader until `Loader.close()` (or
        until the loader is collected and its iterators are done). Batches and checkpoints are
        the same for every count and kind.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).workers(4).build(RangeDataset(0, 4))
        >>> [batch.tolist() for batch in loader]  # the same batches for any number of threads
        [[0, 1], [2, 3]]
        >>> builder = DataLoader(Batcher()).batch_size(2).workers(2, kind="processes")
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 4).map(str))]
        [['0', '1'], ['2', '3']]

        `workers("auto")` starts with one and adds threads (up to 2 per core) or processes (up to
        one per core) while the training loop waits for batches: as many as make a batch in the
        time the loop takes one, within `memory_budget_mb`. Each choice is logged and in
        `stats().tuning`; the batches are the same. Without `prefetch(n)`, it chooses the depth
        too (see `prefetch("auto")`).
        """
        if count == "auto":
            return self._with(
                concurrency=DEFAULT_CONCURRENCY, loading_kind=kind, autotune_workers=True
            )
        return self._with(concurrency=count, loading_kind=kind, autotune_workers=False)

    def prefetch(self, batches: int | Literal["auto"]) -> Self:
        """Batches (for a stream: windows per data shard) loaded ahead of the training loop.

        Needs loading threads: `workers(n)` with n >= 1. Default 2. `prefetch("auto")` loads as
        far ahead as hides a batch's loading behind the training loop's step (measured, see
        `workers("auto")`), within `memory_budget_mb`.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2).workers(2).prefetch(4)
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 4))]
        [[0, 1], [2, 3]]
        >>> builder = DataLoader(Batcher()).batch_size(2).workers("auto").prefetch("auto")
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 4))], builder
        ([[0, 1], [2, 3]], DataLoader(Batcher()).batch_size(2).workers('auto').prefetch('auto'))
        """
        if batches == "auto":
            return self._with(prefetch=None, autotune_prefetch=True)
        return self._with(prefetch=batches, autotune_prefetch=False)

    def memory_budget_mb(self, megabytes: int) -> Self:
        """The most MiB of batches autotune (`workers("auto")`, `prefetch("auto")`) lets the
        loader hold, loading and ready. Default 1024."""
        return self._with(memory_budget_mb=megabytes)

    def build(self, dataset: Dataset[T] | Stream[T]) -> Loader[B]:
        """The loader of `dataset` (or of a stream): iterate it as many times as you like.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4).map(str))
        >>> [batch.tolist() for batch in loader], [batch.tolist() for batch in loader]
        ([['0', '1'], ['2', '3']], [['0', '1'], ['2', '3']])
        """
        options = self._options
        pipeline = Pipeline(dataset, self._batcher)
        if pipeline.stream is not None and options.buckets is not None:
            raise ValueError(
                "bucket_by_length needs a random-access dataset: a stream (filter, pack) has "
                "no records of known length before it reads them"
            )
        plan = options.plan(pipeline.num_records, lambda indices: pipeline.read(indices, 0))
        stats = StatsRecorder()
        executors = LocalExecutors(pipeline, options, stats)
        stream = pipeline.stream
        return Loader(
            plan,
            options,
            executors,
            prefetch=executors.prefetch,
            pipeline=pipeline,
            stream_window=None if stream is None else stream.window,
            stats=stats,
            description=f"{self!r}.build({dataset_repr(dataset)})",
            processes=executors.processes,
        )
