"""`Loader`: what a builder (`DataLoader`, `RemoteDataLoader`) builds, a stateless definition whose
every `iter()` starts a new iterator: its epochs, fingerprint, stats and determinism check."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, Self

from typing_extensions import TypeVar

from loadax.dataset.cache import reuse_of
from loadax.dataset.records import varies_by_epoch
from loadax.dataset.stream import ALL_ITEMS, Items
from loadax.delivery.device import DeviceIterator
from loadax.execution.executor import Executor
from loadax.execution.pipeline import Pipeline
from loadax.execution.processes import SharedProcesses
from loadax.execution.record_errors import RecordErrors, TolerantExecutor
from loadax.identity.fingerprint import pipeline_fingerprint
from loadax.iterators.base import LoaderIterator
from loadax.iterators.batches import BatchIterator
from loadax.iterators.determinism import check_determinism
from loadax.iterators.passes import Passes
from loadax.iterators.stats import LoaderStats, StatsRecorder
from loadax.iterators.streams import StreamIterator
from loadax.options import LoaderOptions
from loadax.plan.planner import Plan
from loadax.validation import require_int

B = TypeVar("B", default=Any)


class Loader(Generic[B]):
    """A stateless loader definition: every `iter()` starts a new iterator at step 0.

    `iter(loader)` yields the whole plan (every epoch of `num_epochs`); `loader.epoch(e)` yields
    epoch `e` alone. With `stream_window`, the batches are cut from the windows of a stream of
    that size. `stats` counts what the loop got and waited for, over all the loader's iterators.
    Its iterators' states record its pipeline's `fingerprint()`, and refuse a state of another.
    Its loader `processes`, if any, serve all its iterators until `close()` (or collection).

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
        processes: SharedProcesses[B] | None = None,
    ) -> None:
        self.plan, self.pipeline, self.stream_window = plan, pipeline, stream_window
        self.sharding_strategy = options.sharding_strategy()
        for size in {plan.batch_size, *(size for _, size in plan.batch_size_changes)}:
            self.sharding_strategy.check_batch_length(size, "the global batch size")
        if stream_window is None:
            for length in plan.batch_lengths():
                self.sharding_strategy.check_batch_length(
                    length, "the last batch of an epoch (drop it with .drop_remainder())"
                )
        self._executor, self._prefetch = executor, prefetch
        self._record_errors = _checked_policy(options, stream_window)
        self._device_prefetch = options.device_prefetch
        self._options, self._description = options, description
        self._recorder = StatsRecorder() if stats is None else stats
        varies = plan.shuffle or (pipeline is not None and varies_by_epoch(pipeline.dataset))
        self._passes = Passes(varies)
        self._fingerprint: str | None = None
        self._fingerprint_lock = threading.Lock()
        self._processes = processes
        if processes is not None:
            weakref.finalize(self, processes.disown)

    def __iter__(self) -> LoaderIterator[B]:
        return self._delivered(self._host_batches(self._passes, **self._host_role()))

    def fingerprint(self) -> str:
        """The fingerprint (64 hex digits) of the loader's pipeline: a digest of its code and
        of a probe batch, the same a worker announces for the same pipeline.

        Computed on the first call (it runs the probe) and kept. Iterator states record it, and
        `set_state` refuses a state of another unless `allow_new_pipeline=True`.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2)
        >>> loader = builder.build(RangeDataset(0, 6).map(lambda x: 2 * x))
        >>> len(loader.fingerprint()), loader.fingerprint() == loader.fingerprint()
        (64, True)
        >>> tripled = builder.build(RangeDataset(0, 6).map(lambda x: 3 * x))
        >>> loader.fingerprint() == tripled.fingerprint()
        False
        """
        with self._fingerprint_lock:
            if self._fingerprint is None:
                if self.pipeline is None:
                    raise TypeError(f"{self!r} was built without a pipeline to fingerprint")
                self._fingerprint = pipeline_fingerprint(self.pipeline)
            return self._fingerprint

    def check_determinism(self, steps: int = 2) -> None:
        """Load the first `steps` batches twice, from two fresh iterators, and compare them byte
        for byte: a ValueError ("the pipeline is not deterministic: step S, leaf L differs ...")
        naming the first that differ. Checkpoints and workers need each batch to be a function of
        its step alone; a map that draws from `np.random` or `random` without a seed is not (use
        `random_map`). The loads do not count in `stats()`.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
        >>> loader.check_determinism(steps=3)
        """
        check_determinism(lambda: self._host_batches(passes=None), steps)

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
            self._new_executor(self._recorder),
            self.plan,
            self.sharding_strategy,
            prefetch=self._prefetch,
            epoch=epoch,
            **self._host_role(),
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
        reuse = None if self.pipeline is None else reuse_of(self.pipeline.dataset)
        return self._recorder.snapshot(reuse=reuse)

    def close(self) -> None:
        """Stop the loader's processes (`workers(n, kind="processes")`), which otherwise serve
        every epoch and iterator until the loader and its iterators are collected; iterators
        still loading fail. A loader of threads holds nothing between iterators.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2).workers(2, kind="processes")
        >>> with builder.build(RangeDataset(0, 4).map(str)) as loader:
        ...     [[batch.tolist() for batch in loader.epoch(e)] for e in range(2)]
        [[['0', '1'], ['2', '3']], [['0', '1'], ['2', '3']]]
        """
        if self._processes is not None:
            self._processes.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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

    def _host_batches(self, passes: Passes | None, **role: Any) -> LoaderIterator[B]:
        """A new iterator of the plan's host batches, counting and recording as `role` says."""
        if self.stream_window is None:
            return BatchIterator(
                self._new_executor(role.get("stats")),
                self.plan,
                self.sharding_strategy,
                prefetch=self._prefetch,
                passes=passes,
                **role,
            )
        return StreamIterator(
            self._executor(),
            self.plan,
            self.sharding_strategy,
            self.stream_window,
            prefetch=self._prefetch,
            items=self._stream_items(),
            passes=passes,
            **role,
        )

    def _new_executor(self, stats: StatsRecorder | None) -> Executor[B]:
        """An executor for a new iterator, under the bad-record policy (reporting to `stats`)."""
        executor = self._executor()
        if self._record_errors.mode == "raise":
            return executor
        report = (lambda record: None) if stats is None else stats.bad_record
        return TolerantExecutor(executor, self._record_errors, report)

    def _stream_items(self) -> Items:
        """The stream's `take` and `skip` (a remote loader's worker streams have none)."""
        stream = None if self.pipeline is None else self.pipeline.stream
        return ALL_ITEMS if stream is None else stream.items

    def _host_role(self) -> dict[str, Any]:
        """What the training loop's host iterator counts and records: what the loop takes and
        the fingerprint, or under device prefetch (whose iterator does both) its batches' sizes."""
        if self._device_prefetch is None:
            return {"stats": self._recorder, "fingerprint": self.fingerprint}
        return {"stats": self._recorder, "counts_loop": False}

    def _delivered(self, host_batches: LoaderIterator[B]) -> LoaderIterator[B]:
        if self._device_prefetch is None:
            return host_batches
        return DeviceIterator(
            host_batches,
            self.sharding_strategy,
            self._device_prefetch,
            stats=self._recorder,
            fingerprint=self.fingerprint,
        )


def _checked_policy(options: LoaderOptions, stream_window: int | None) -> RecordErrors:
    """The loader's bad-record policy, refused where it cannot apply."""
    policy = options.record_errors
    if policy.mode != "raise" and stream_window is not None:
        raise ValueError(
            f"on_record_error({policy.mode!r}) applies to random-access pipelines: a stream "
            "(filter, pack) has no rows to skip or fill; catch the failure in its map and filter "
            "out what it returns instead"
        )
    if policy.mode == "skip" and options.mesh is not None:
        raise ValueError(
            "on_record_error('skip') makes a batch shorter, and a batch sharded over a mesh "
            "must keep its shape: use on_record_error('replace')"
        )
    return policy
