"""`DataLoader`: the builder of a local loader, and `Loader`, the stateless definition it builds."""

from __future__ import annotations

import copy as copy_module
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, Literal, Self, get_args

from jax.sharding import Mesh
from typing_extensions import TypeVar

from loadax.collate.batcher import Batcher
from loadax.dataset.names import dataset_repr
from loadax.dataset.protocol import Dataset
from loadax.dataset.records import varies_by_epoch
from loadax.dataset.stream import Stream
from loadax.delivery.device import DeviceIterator
from loadax.delivery.sharding import DataAxis, ShardingStrategy, data_axis_of
from loadax.execution.executor import Executor
from loadax.execution.inline import InlineExecutor
from loadax.execution.pickled import PickledPipeline
from loadax.execution.pipeline import Pipeline
from loadax.execution.processes import ProcessExecutor
from loadax.execution.threads import ThreadExecutor
from loadax.iterators.base import LoaderIterator
from loadax.iterators.batches import BatchIterator
from loadax.iterators.passes import Passes
from loadax.iterators.stats import LoaderStats, StatsRecorder
from loadax.iterators.streams import StreamIterator
from loadax.plan.planner import Plan
from loadax.validation import require_bool, require_int

T = TypeVar("T", default=Any)
B = TypeVar("B", default=Any)

DEFAULT_WORKERS = 1
DEFAULT_PREFETCH = 2

WorkerKind = Literal["threads", "processes"]


@dataclasses.dataclass(frozen=True, slots=True)
class LoaderOptions:
    """Everything a `DataLoader` builder has been told; checked as it is set."""

    batch_size: int | None = None
    shuffle: bool = False
    seed: int = 0
    num_epochs: int | None = 1
    drop_remainder: bool = False
    workers: int = DEFAULT_WORKERS
    worker_kind: WorkerKind = "threads"
    prefetch: int | None = None  # None: DEFAULT_PREFETCH with workers, none without
    mesh: Mesh | None = None
    data_axis: DataAxis | None = None
    device_prefetch: int | None = None  # None: yield host batches

    def __post_init__(self) -> None:
        optional = ("batch_size", "num_epochs", "prefetch", "device_prefetch")
        for name, minimum in (
            ("batch_size", 1),
            ("seed", 0),
            ("num_epochs", 1),
            ("workers", 0),
            ("prefetch", 1),
            ("device_prefetch", 0),
        ):
            value = getattr(self, name)
            if value is not None or name not in optional:
                object.__setattr__(self, name, require_int(name, value, minimum=minimum))
        require_bool("shuffle", self.shuffle)
        require_bool("drop_remainder", self.drop_remainder)
        if self.worker_kind not in get_args(WorkerKind):
            raise ValueError(
                f"workers(kind=...) must be one of {list(get_args(WorkerKind))}, "
                f"got {self.worker_kind!r}"
            )
        if self.worker_kind == "processes" and self.workers == 0:
            raise ValueError(
                "workers(0, kind='processes') starts no process: workers(0) loads each batch "
                "in the calling thread; ask for workers >= 1"
            )
        if self.prefetch is not None and self.workers == 0:
            raise ValueError(
                f"prefetch({self.prefetch}) needs workers >= 1: "
                "workers(0) loads each batch in the calling thread when it is asked for"
            )

    def sharding_strategy(self) -> ShardingStrategy:
        return ShardingStrategy(self.mesh, self.data_axis)

    def calls(self) -> str:
        """The builder calls that set these options, those left at their defaults left out."""
        calls = []
        if self.batch_size is not None:
            calls.append(f"batch_size({self.batch_size})")
        if self.shuffle:
            calls.append(f"shuffle(seed={self.seed})")
        if self.num_epochs != 1:
            calls.append(f"num_epochs({self.num_epochs})")
        if self.drop_remainder:
            calls.append("drop_remainder()")
        if self.worker_kind != "threads":
            calls.append(f"workers({self.workers}, kind={self.worker_kind!r})")
        elif self.workers != DEFAULT_WORKERS:
            calls.append(f"workers({self.workers})")
        if self.prefetch is not None:
            calls.append(f"prefetch({self.prefetch})")
        if self.mesh is not None:
            calls.append(f"shard(<mesh {dict(self.mesh.shape)}>, {self.data_axis!r})")
        if self.device_prefetch is not None:
            calls.append(f"device_prefetch({self.device_prefetch})")
        return "".join(f".{call}" for call in calls)

    def plan(self, num_records: int) -> Plan:
        if self.batch_size is None:
            raise ValueError("batch_size is required: call .batch_size(n) before .build()")
        return Plan(
            num_records=num_records,
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
            num_epochs=self.num_epochs,
            drop_remainder=self.drop_remainder,
        )


class LoaderBuilder:
    """The options every loader builder shares; each method returns a new builder."""

    def __init__(self, options: LoaderOptions | None = None) -> None:
        self._options = LoaderOptions() if options is None else options

    def batch_size(self, size: int) -> Self:
        """Records per batch (the global batch size once sharded).

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> len(DataLoader(Batcher()).batch_size(3).build(RangeDataset(0, 10)))
        4
        """
        return self._with(batch_size=size)

    def shuffle(self, seed: int = 0) -> Self:
        """Visit the records in a different keyed random order in every epoch.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(3).shuffle(seed=3).num_epochs(2)
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 6))]
        [[3, 5, 2], [0, 4, 1], [4, 2, 0], [1, 3, 5]]
        """
        return self._with(shuffle=True, seed=seed)

    def num_epochs(self, epochs: int | None) -> Self:
        """Passes over the dataset; None repeats forever. Default 1.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).num_epochs(2).build(RangeDataset(0, 3))
        >>> [batch.tolist() for batch in loader]
        [[0, 1], [2], [0, 1], [2]]
        """
        return self._with(num_epochs=epochs)

    def drop_remainder(self, drop: bool = True) -> Self:
        """Drop the short last batch of each epoch.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).drop_remainder().build(RangeDataset(0, 5))
        >>> [batch.tolist() for batch in loader]
        [[0, 1], [2, 3]]
        """
        return self._with(drop_remainder=drop)

    def shard(self, mesh: Mesh, data_axis_name: str | Sequence[str] = "data") -> Self:
        """Split each global batch over `mesh` along `data_axis_name` (an axis or a tuple).

        `batch_size` is then the global batch size; this process loads only the rows that its
        own devices hold.

        >>> import jax
        >>> import numpy as np
        >>> from jax.sharding import Mesh
        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> mesh = Mesh(np.array(jax.devices()), ("data",))
        >>> loader = DataLoader(Batcher()).batch_size(8).shard(mesh).build(RangeDataset(0, 16))
        >>> next(iter(loader)).tolist()  # a single process holds every row
        [0, 1, 2, 3, 4, 5, 6, 7]
        """
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        return self._with(mesh=mesh, data_axis=data_axis_of(mesh, data_axis_name))

    def device_prefetch(self, depth: int = 2) -> Self:
        """Yield global jax.Arrays, with the copies of the next `depth` batches under way.

        Right after a batch is yielded, exactly the `depth` batches after it have been loaded
        and are copying (0: each batch is loaded and copied when it is asked for).

        >>> import jax
        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(4).device_prefetch(2)
        >>> batch = next(iter(builder.build(RangeDataset(0, 8))))
        >>> isinstance(batch, jax.Array), batch.tolist()
        (True, [0, 1, 2, 3])
        """
        return self._with(device_prefetch=depth)

    def __repr__(self) -> str:
        return f"{self._repr_head()}{self._options.calls()}"

    def _repr_head(self) -> str:
        """How the builder was made, before its option calls (here: its arguments elided)."""
        return f"{type(self).__name__}(...)"

    def _with(self, **changes: Any) -> Self:
        copy = copy_module.copy(self)
        copy._options = dataclasses.replace(self._options, **changes)
        return copy


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

    def workers(self, count: int, kind: WorkerKind = "threads") -> Self:
        """Threads (or processes) that load batches; 0 loads in the calling thread. Default 1.

        Threads split each batch between them: best when the work releases the GIL (numpy,
        I/O). With `kind="processes"`, each process loads whole batches, several at once: for
        Python transforms that hold the GIL. The pipeline is pickled when the loader is built,
        so its functions must be defined at module level, and batches come back through shared
        memory, so they must be what `loadax.wire.codec` encodes (dicts, lists, tuples of arrays).
        With processes, `prefetch` defaults to at least `count`. Batches and checkpoints are the
        same for every count and kind.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).workers(4).build(RangeDataset(0, 4))
        >>> [batch.tolist() for batch in loader]  # the same batches for any number of workers
        [[0, 1], [2, 3]]
        >>> builder = DataLoader(Batcher()).batch_size(2).workers(2, kind="processes")
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 4).map(str))]
        [['0', '1'], ['2', '3']]
        """
        return self._with(workers=count, worker_kind=kind)

    def prefetch(self, batches: int) -> Self:
        """Batches (for a stream: windows per data shard) loaded ahead of the training loop.

        Needs workers >= 1. Default 2.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2).workers(2).prefetch(4)
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 4))]
        [[0, 1], [2, 3]]
        """
        return self._with(prefetch=batches)

    def build(self, dataset: Dataset[T] | Stream[T]) -> Loader[B]:
        """The loader of `dataset` (or of a stream): iterate it as many times as you like.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4).map(str))
        >>> [batch.tolist() for batch in loader], [batch.tolist() for batch in loader]
        ([['0', '1'], ['2', '3']], [['0', '1'], ['2', '3']])
        """
        options = self._options
        pipeline = Pipeline(dataset, self._batcher)
        plan = options.plan(pipeline.num_records)
        workers = options.workers
        pickled = PickledPipeline(pipeline) if options.worker_kind == "processes" else None

        def executor() -> Executor[B]:
            if pickled is not None:
                return ProcessExecutor(pickled, workers)
            return ThreadExecutor(pipeline, workers) if workers else InlineExecutor(pipeline)

        # Each process loads whole batches: keep every one of them busy.
        default_prefetch = DEFAULT_PREFETCH if pickled is None else max(DEFAULT_PREFETCH, workers)
        prefetch = 0 if workers == 0 else options.prefetch or default_prefetch
        stream = pipeline.stream
        return Loader(
            plan,
            options,
            executor,
            prefetch=prefetch,
            pipeline=pipeline,
            stream_window=None if stream is None else stream.window,
            description=f"{self!r}.build({dataset_repr(dataset)})",
        )


class Loader(Generic[B]):
    """A stateless loader definition: every `iter()` starts a new iterator at step 0.

    `iter(loader)` yields the whole plan (every epoch of `num_epochs`); `loader.epoch(e)` yields
    epoch `e` alone. With `stream_window`, the batches are cut from the windows of a stream of
    that size. `stats` counts what the loop got and waited for, over all the loader's iterators.

    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 5))
    >>> len(loader), loader.plan.num_records
    (3, 5)
    >>> first, second = iter(loader), iter(loader)
    >>> next(first).tolist(), next(first).tolist(), next(second).tolist()
    ([0, 1], [2, 3], [0, 1])
    >>> loader
    DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 5))
    """

    def __init__(
        self,
        plan: Plan,
        options: LoaderOptions,
        executor: Callable[[], Executor[B]],
        *,
        prefetch: int,
        pipeline: Pipeline[Any, B] | None = None,
        stream_window: int | None = None,
        stats: StatsRecorder | None = None,
        description: str | None = None,
    ) -> None:
        self.plan, self.pipeline, self.stream_window = plan, pipeline, stream_window
        self.sharding_strategy = options.sharding_strategy()
        self.sharding_strategy.check_batch_length(plan.batch_size, "the global batch size")
        short = plan.num_records % plan.batch_size
        if short and not plan.drop_remainder and stream_window is None:
            self.sharding_strategy.check_batch_length(
                short, "the last batch of each epoch (drop it with .drop_remainder())"
            )
        self._executor, self._prefetch = executor, prefetch
        self._device_prefetch = options.device_prefetch
        self._options, self._description = options, description
        self._recorder = StatsRecorder() if stats is None else stats
        varies = plan.shuffle or (pipeline is not None and varies_by_epoch(pipeline.dataset))
        self._passes = Passes(varies)

    def __iter__(self) -> LoaderIterator[B]:
        host_batches: LoaderIterator[B]
        if self.stream_window is None:
            host_batches = BatchIterator(
                self._executor(),
                self.plan,
                self.sharding_strategy,
                prefetch=self._prefetch,
                stats=self._recorder,
                passes=self._passes,
            )
        else:
            host_batches = StreamIterator(
                self._executor(),
                self.plan,
                self.sharding_strategy,
                self.stream_window,
                prefetch=self._prefetch,
                stats=self._recorder,
                passes=self._passes,
            )
        return self._delivered(host_batches)

    def epoch(self, epoch: int) -> LoaderIterator[B]:
        """An iterator of the batches of epoch `epoch` alone, in a new order for each epoch.

        `for e in range(E): for batch in loader.epoch(e):` yields exactly the batches of the
        same loader built with `.num_epochs(E)`, epoch after epoch: the same reshuffles and the
        same short (or dropped) last batch of each epoch. Any epoch can be asked for, also past
        `num_epochs`, which bounds `iter(loader)` only. Its steps are those of the whole plan
        (epoch e starts at step `e * plan.steps_per_epoch`); its state names the epoch, and
        restores into `loader.epoch(e)` of the same loader at the same position.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2).shuffle(seed=0)
        >>> loader = builder.build(RangeDataset(0, 5))
        >>> [[batch.tolist() for batch in loader.epoch(e)] for e in range(2)]
        [[[0, 4], [3, 2], [1]], [[1, 2], [4, 0], [3]]]
        >>> [batch.tolist() for batch in builder.num_epochs(2).build(RangeDataset(0, 5))]
        [[0, 4], [3, 2], [1], [1, 2], [4, 0], [3]]
        >>> iterator = loader.epoch(1)
        >>> _ = next(iterator)
        >>> state = iterator.get_state()
        >>> state["step"], state["epoch"]
        (4, 1)
        >>> resumed = loader.epoch(1)
        >>> resumed.set_state(state)
        >>> [batch.tolist() for batch in resumed]
        [[4, 0], [3]]
        """
        epoch = require_int("epoch", epoch, minimum=0)
        if self.stream_window is not None:
            raise TypeError(
                "a stream (filter, pack) has no epochs of its own: its windows read the plan's "
                "epochs back to back, so a batch may span two. Iterate it with .num_epochs(E), "
                "or .num_epochs(None) and a step count"
            )
        host_batches = BatchIterator(
            self._executor(),
            self.plan,
            self.sharding_strategy,
            prefetch=self._prefetch,
            epoch=epoch,
            stats=self._recorder,
        )
        return self._delivered(host_batches)

    def stats(self) -> LoaderStats:
        """Batches, bytes and rates since the first request, over all the loader's iterators,
        and the share of that time the training loop spent waiting in `next()` for data.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(4).build(RangeDataset(0, 10))
        >>> loader.stats().batches, [len(batch) for batch in loader], loader.stats().batches
        (0, [4, 4, 2], 3)
        >>> stats = loader.stats()
        >>> stats.bytes, stats.batches_per_second > 0, 0 <= stats.wait_fraction <= 1
        (80, True, True)
        """
        return self._recorder.snapshot(())

    def __len__(self) -> int:
        """The number of batches an iterator yields."""
        if self.stream_window is not None:
            raise TypeError(
                "a stream's loader has no length: how many records survive is known only "
                "once they are read"
            )
        steps = self.plan.num_steps
        if steps is None:
            raise TypeError("a loader with num_epochs(None) repeats forever and has no length")
        return steps

    def __repr__(self) -> str:
        if self._description is not None:
            return self._description
        settings = self._options.calls().lstrip(".")
        return f"<{type(self).__name__} of {self.plan.num_records} records: {settings}>"

    def _delivered(self, host_batches: LoaderIterator[B]) -> LoaderIterator[B]:
        if self._device_prefetch is None:
            return host_batches
        return DeviceIterator(host_batches, self.sharding_strategy, self._device_prefetch)
