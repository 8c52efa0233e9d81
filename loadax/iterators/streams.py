"""The iterator of a stream: batches cut in order from the stacked rows of consecutive windows.

Each data shard this process reads has its own stream; the process's rows of a batch are the
next `batch_size / shards` rows of each of its shards, in shard order. Windows load ahead,
`prefetch` per shard. The state is a cursor per shard, (window, rows of it already used), and the
rows each shard has yielded (what `take` counts): small, and the same whether the windows were
made locally or by workers; it records the pipeline's fingerprint too.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from loadax.dataset.stream import ALL_ITEMS, Items
from loadax.delivery.sharding import ShardingStrategy
from loadax.execution.executor import Executor, Pending
from loadax.iterators.base import LoaderIterator
from loadax.iterators.passes import Passes
from loadax.iterators.stats import LoopCounts, StatsRecorder
from loadax.plan.planner import Plan
from loadax.plan.work import StreamWindow, shard_length
from loadax.state.checks import STATE_VERSION, check_fingerprint, checked_step, require_same


class StreamIterator(LoaderIterator[Any]):
    """Yields this process's rows of each batch of a stream, cut from its shards' windows.

    Iteration ends at the first batch that one of this process's shards cannot fill; that short
    batch is yielded only when there is one data shard and the plan keeps remainders.
    `items` (the stream's `take` and `skip`) are shared by the data shards: each skips its share
    of `items.start` before its first batch and ends after its share of what follows.
    `stats`, `counts_loop` and `fingerprint` are as `BatchIterator`'s.
    """

    def __init__(
        self,
        executor: Executor[Any],
        plan: Plan,
        sharding: ShardingStrategy,
        window_size: int,
        *,
        prefetch: int,
        items: Items = ALL_ITEMS,
        stats: StatsRecorder | None = None,
        counts_loop: bool = True,
        passes: Passes | None = None,
        fingerprint: Callable[[], str] | None = None,
    ) -> None:
        self._executor, self._plan, self._window_size = executor, plan, window_size
        self._skip, self._limit = items.per_shard(sharding.num_data_shards)
        self._fingerprint = fingerprint
        self._num_shards = sharding.num_data_shards
        recorder = StatsRecorder() if stats is None else stats
        self._counts = recorder.counts(self, loop=counts_loop)
        self._passes = passes
        own = sharding.rows(self._num_shards)
        shards = range(self._num_shards) if own is None else own.tolist()
        self._shards = [
            _ShardStream(
                executor,
                plan,
                window_size,
                StreamWindow(self._num_shards, shard, 0),
                self._counts,
            )
            for shard in shards
        ]
        self._prefetch = prefetch
        self._step = 0
        self._taken = 0  # rows each shard yielded since its skip: whatever the batch sizes were
        self._closed = False
        self._finalizer = weakref.finalize(self, executor.release, False)

    def __next__(self) -> Any:
        counts = self._counts
        started = counts.clock()
        try:
            batch = self._next_batch()
        except BaseException:
            counts.counted(started)
            raise
        counts.counted(started, batch)
        return batch

    @property
    def step(self) -> int:
        return self._step

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "step": self._step,
            "plan": self._plan.describe(),
            "stream": {
                "window": self._window_size,
                "shards": self._num_shards,
                "cursors": {str(shard.shard): shard.cursor for shard in self._shards},
                "taken": self._taken,
            },
        }
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
        # The cursors say which rows come next, whatever the batch size: the shards go on.
        step = checked_step(state, self._plan, allow_new_batch_size)
        cursors = self._checked_cursors(state.get("stream"))
        if self._fingerprint is not None:
            check_fingerprint(state, self._fingerprint, allow_new_pipeline)
        for shard in self._shards:
            shard.seek(*cursors[str(shard.shard)])
        self._step, self._taken = step, self._checked_taken(state["stream"], step)
        self._passes = None  # a resumed run is no full pass

    def close(self) -> None:
        self._closed = True
        self._release(wait=True)

    def _next_batch(self) -> Any:
        if self._closed:
            raise StopIteration
        rows_per_shard = self._plan.batch_size_at(self._step) // self._num_shards
        wanted = rows_per_shard
        if self._limit is not None:
            wanted = max(0, min(wanted, self._limit - self._taken))
        try:
            unstarted = all(shard.cursor == [0, 0] for shard in self._shards)
            if self._skip and self._step == 0 and unstarted:
                for shard in self._shards:
                    shard.take(shard.available(self._skip), 0)
            available = min(shard.available(wanted) for shard in self._shards)
        except BaseException:
            # The cursors still point at the failed batch: a next() or a restore retries it.
            for shard in self._shards:
                shard.cancel()
            raise
        # A short last batch: one shard's, or the end of `take`, which every shard reaches.
        alike = self._num_shards == 1 or available == wanted
        keep_short = alike and not self._plan.drop_remainder
        if available == 0 or (available < rows_per_shard and not keep_short):
            if self._passes is not None:
                passes, self._passes = self._passes, None
                passes.finished(stacklevel=3)
            self._release(wait=False)
            raise StopIteration
        ahead = self._executor.lookahead(self._prefetch)
        parts = [shard.take(available, ahead) for shard in self._shards]
        self._step += 1
        self._taken += available
        return _concatenate(parts)

    def _checked_cursors(self, stream: Any) -> dict[str, tuple[int, int]]:
        if not isinstance(stream, dict):
            raise ValueError(
                f"iterator state has stream {stream!r}; a stream's state has a dict of cursors "
                "(is it the state of a random-access loader?)"
            )
        require_same(stream, {"window": self._window_size, "shards": self._num_shards}, "stream")
        cursors = stream.get("cursors")
        if not isinstance(cursors, dict):
            raise ValueError(f"iterator state has cursors {cursors!r}; it must be a dict")
        checked = {}
        for shard in self._shards:
            cursor = cursors.get(str(shard.shard))
            if not (
                isinstance(cursor, list | tuple)
                and len(cursor) == 2
                and all(type(value) is int and value >= 0 for value in cursor)
            ):
                raise ValueError(
                    f"iterator state has cursor {cursor!r} for data shard {shard.shard}; it must "
                    f"be [window, offset] (ints >= 0). The state holds shards {sorted(cursors)}: "
                    "restore each process's own state"
                )
            checked[str(shard.shard)] = (cursor[0], cursor[1])
        return checked

    def _checked_taken(self, stream: dict[str, Any], step: int) -> int:
        """The rows each shard yielded before `step`; a state saved before loadax recorded them
        yielded full batches of this plan's sizes."""
        taken = stream.get("taken")
        if taken is None:
            return self._plan.rows_before(step) // self._num_shards
        if type(taken) is not int or taken < 0:
            raise ValueError(f"iterator state has taken {taken!r}; it must be an int >= 0")
        return taken

    def _release(self, wait: bool) -> None:
        for shard in self._shards:
            shard.cancel()
        self._executor.release(wait)


class _ShardStream:
    """One data shard's stream: windows loading ahead, and the cursor of the next unused row."""

    def __init__(
        self,
        executor: Executor[Any],
        plan: Plan,
        window_size: int,
        first: StreamWindow,
        counts: LoopCounts,
    ) -> None:
        self._executor, self._plan, self._counts = executor, plan, counts
        self._shards, self.shard = first.shards, first.shard
        length = shard_length(plan, first.shards, first.shard)
        self._num_windows = None if length is None else -(-length // window_size)
        self._window, self._offset = 0, 0  # the cursor: window, rows of it already taken
        self._loaded: deque[tuple[Any, int]] = deque()  # windows from the cursor's on: rows, count
        self._in_flight: deque[Pending[Any]] = deque()  # the windows after those
        self._next_submit = 0

    @property
    def cursor(self) -> list[int]:
        return [self._window, self._offset]

    def seek(self, window: int, offset: int) -> None:
        self.cancel()
        self._window, self._offset = window, offset
        self._loaded.clear()
        self._next_submit = window

    def available(self, wanted: int) -> int:
        """Load windows until `wanted` rows are ready or the stream ends; how many are ready."""
        ready = sum(count for _, count in self._loaded) - self._offset
        while ready < wanted and not self._ended(self._window + len(self._loaded)):
            if not self._in_flight:
                self._submit_next()
            rows = self._in_flight[0].result()
            self._in_flight.popleft()
            if rows is not None:
                self._counts.loaded(rows)
            count = 0 if rows is None else len(jax.tree.leaves(rows)[0])
            self._loaded.append((rows, count))
            ready += count
        return min(wanted, ready)

    def take(self, count: int, prefetch: int) -> Any:
        """The next `count` rows (already `available`), and more windows started loading."""
        parts = []
        while count:
            rows, size = self._loaded[0]
            used = min(count, size - self._offset)
            if used:
                part = slice(self._offset, self._offset + used)
                parts.append(jax.tree.map(lambda leaf, part=part: leaf[part], rows))
            count -= used
            self._offset += used
            if self._offset == size:
                self._loaded.popleft()
                self._window, self._offset = self._window + 1, 0
        while len(self._in_flight) < prefetch and not self._ended(self._next_submit):
            self._submit_next()
        return _concatenate(parts)

    def cancel(self) -> None:
        while self._in_flight:
            self._in_flight.popleft().cancel()
        self._next_submit = self._window + len(self._loaded)

    def _ended(self, window: int) -> bool:
        return self._num_windows is not None and window >= self._num_windows

    def _submit_next(self) -> None:
        window = StreamWindow(self._shards, self.shard, self._next_submit)
        self._in_flight.append(self._executor.submit(self._plan, window))
        self._next_submit += 1


def merged_state(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One stream state with the cursors of every data shard that any of `states` holds.

    `states` are the states that the processes of one job saved at the same step; the merged
    state restores in any process, whichever data shards it reads now.
    """
    first = states[0]
    cursors: dict[str, Any] = {}
    for state in states:
        if (state.get("step"), state.get("plan")) != (first.get("step"), first.get("plan")):
            raise ValueError(
                f"the processes' stream states differ: step {state.get('step')!r} and "
                f"{first.get('step')!r}; they must come from one checkpoint"
            )
        cursors.update(state.get("stream", {}).get("cursors", {}))
    return {**first, "stream": {**first["stream"], "cursors": cursors}}


def _concatenate(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *leaves: np.concatenate(leaves), *parts)
