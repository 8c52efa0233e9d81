"""`LoaderBuilder`: the builder methods every loader shares, local or remote; each returns a
new builder, so a partly configured builder can be shared."""

from __future__ import annotations

import copy as copy_module
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Self, cast

import numpy.typing as npt
from jax.sharding import Mesh

from loadax.delivery.sharding import data_axis_of
from loadax.execution.record_errors import DEFAULT_BUDGET, RecordErrorMode, RecordErrors
from loadax.options import LoaderOptions
from loadax.plan.blocks import BlockShuffle
from loadax.plan.buckets import LengthBuckets, LengthsOf
from loadax.plan.segments import checked_changes
from loadax.validation import require_int


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
        return self._with(batch_size=size, batch_size_changes=())

    def batch_size_schedule(self, schedule: Sequence[tuple[int, int]]) -> Self:
        """Change the (global) batch size at steps: `[(0, 256), (2000, 512), (6000, 1024)]`.

        At each change, the epoch under way continues from its first record not yet delivered:
        every record once per epoch. The batches are the same for any number of processes,
        workers and mode, and a state at any step restores them.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size_schedule([(0, 2), (2, 4)])
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 10))]
        [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9]]
        """
        if isinstance(schedule, str | bytes) or not isinstance(schedule, Sequence) or not schedule:
            raise ValueError(
                f"batch_size_schedule takes a list of (step, batch_size) pairs, got {schedule!r}"
            )
        first, *later = schedule
        if not isinstance(first, tuple | list) or len(first) != 2 or first[0] != 0:
            raise ValueError(
                f"batch_size_schedule's first change must be (0, batch_size), got {first!r}"
            )
        size = require_int("batch_size_schedule's first batch_size", first[1], minimum=1)
        return self._with(batch_size=size, batch_size_changes=checked_changes(later, 0))

    def bucket_by_length(
        self,
        lengths: npt.ArrayLike | Callable[[Any], int],
        boundaries: Sequence[int] | None = None,
        num_buckets: int | None = None,
    ) -> Self:
        """Make every global step's records come from one length bucket, so that data-parallel
        replicas get rows of similar lengths.

        `lengths` is one int per record, or a function of a record that the loader calls once
        per record when it is built. Bucket k holds the lengths in [boundaries[k-1],
        boundaries[k]); `num_buckets` instead splits the records into buckets of equal counts.
        Every record comes once per epoch; the order of the buckets' batches over the steps is
        keyed random (seed, epoch), and with `shuffle` so is each bucket's order of records. The
        last short batch of each bucket is a step of its own unless `drop_remainder`.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> lengths = [1, 9, 2, 8, 3, 7]
        >>> builder = DataLoader(Batcher()).batch_size(3).bucket_by_length(lengths, [5])
        >>> sorted(batch.tolist() for batch in builder.build(RangeDataset(0, 6)))
        [[0, 2, 4], [1, 3, 5]]
        """
        if callable(lengths):
            if (boundaries is None) == (num_buckets is None):
                raise ValueError("bucket_by_length takes boundaries or num_buckets, exactly one")
            bounds = None if boundaries is None else tuple(boundaries)
            return self._with(buckets=LengthsOf(lengths, bounds, num_buckets))
        return self._with(buckets=LengthBuckets(lengths, boundaries, num_buckets))

    def shuffle(
        self, seed: int = 0, *, block_size: int | None = None, window: int | None = None
    ) -> Self:
        """Visit the records in a different keyed random order in every epoch.

        With `block_size` and `window`, a block shuffle (for data in shards): every epoch
        shuffles the order of the blocks of `block_size` consecutive records, and the records
        within each window of `window` blocks in that order. A source in a store then fetches
        each window's blocks in a few large reads, where an exact shuffle reads each record
        apart; the quality is that of webdataset's shard shuffle and buffer of
        `block_size * window` records. Still every record once per epoch, and exactly resumable.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(3).shuffle(seed=3).num_epochs(2)
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 6))]
        [[3, 5, 2], [0, 4, 1], [4, 2, 0], [1, 3, 5]]
        >>> blocked = builder.shuffle(seed=1, block_size=3, window=2).num_epochs(1)
        >>> [batch.tolist() for batch in blocked.build(RangeDataset(0, 12))]  # blocks 3, 2; 0, 1
        [[7, 6, 9], [11, 10, 8], [1, 5, 0], [4, 2, 3]]
        """
        if (block_size is None) != (window is None):
            raise ValueError(
                "a block shuffle takes block_size and window, both: got "
                f"block_size={block_size!r}, window={window!r}"
            )
        blocks = None if block_size is None else BlockShuffle(block_size, cast(int, window))
        return self._with(shuffle=True, seed=seed, blocks=blocks)

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

    def on_record_error(self, mode: RecordErrorMode, budget: int | float = DEFAULT_BUDGET) -> Self:
        """What a record that fails to load does: "raise" (the default) ends iteration with its
        `RecordError`; "skip" drops it from its batch, which is shorter by one; "replace" fills
        its row with the next record of the same epoch that loads (in delivery order, wrapping
        to the epoch's start). Each one is logged and listed in `stats().bad_records`. More than
        `budget` bad records in an epoch (an int, or a share of its records: 0.1 % by default,
        at least 1) raise `TooManyBadRecords`. A storage outage (`StorageError`) is never a bad
        record. The batches are the same for any executor, worker count and resume.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> def decode(x):
        ...     if x == 2:
        ...         raise ValueError("truncated")
        ...     return x
        >>> dataset = RangeDataset(0, 6).map(decode)
        >>> builder = DataLoader(Batcher()).batch_size(3).on_record_error("skip", budget=1)
        >>> [batch.tolist() for batch in builder.build(dataset)]
        [[0, 1], [3, 4, 5]]
        >>> loader = builder.on_record_error("replace", budget=1).build(dataset)
        >>> [batch.tolist() for batch in loader], loader.stats().bad_records[0].action
        ([[0, 1, 3], [3, 4, 5]], 'replaced by record 3')
        """
        return self._with(record_errors=RecordErrors(mode, budget))

    def __repr__(self) -> str:
        return f"{self._repr_head()}{self._options.calls()}"

    def _repr_head(self) -> str:
        """How the builder was made, before its option calls (here: its arguments elided)."""
        return f"{type(self).__name__}(...)"

    def _with(self, **changes: Any) -> Self:
        copy = copy_module.copy(self)
        copy._options = dataclasses.replace(self._options, **changes)
        return copy
