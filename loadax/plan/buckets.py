"""Length buckets: every batch's records come from one bucket of similar lengths.

Data-parallel replicas pad their rows to their own longest: with one bucket per global step,
no replica waits for another's long rows. An epoch visits every record once: each bucket's
records in their own keyed order (`shuffle`), cut into batches, and the batches of all buckets
in a keyed random order of steps, so that an epoch's mix of lengths is spread evenly over it.
The last short batch of each bucket is a step of its own unless remainders are dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from loadax.plan.orders import EpochOrder
from loadax.plan.permutation import IndexArray, KeyPurpose, derive_key, permute
from loadax.validation import require_int

_TABLES = 4
"""Step tables kept per buckets (one per part of an epoch in use: a few at a time)."""

_READ_CHUNK = 4096
"""Records read at once to measure their lengths."""

BucketCursor = tuple[int, ...]
Table = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


class LengthBuckets:
    """The records of each length bucket: bucket k holds the lengths in
    [boundaries[k - 1], boundaries[k]) (the first from 0, the last without end).

    With `num_buckets` instead of `boundaries`, the boundaries split the records into buckets
    of (about) equal counts. Holds one index per record (int32 below 2**31 records); planning
    is vectorised: 10**8 records take a few seconds.

    >>> from loadax.plan.buckets import LengthBuckets
    >>> buckets = LengthBuckets([5, 70, 8, 300, 64], boundaries=[64, 256])
    >>> buckets.boundaries, buckets.sizes.tolist(), buckets.members.tolist()
    ((64, 256), [2, 2, 1], [0, 2, 1, 4, 3])
    >>> LengthBuckets(list(range(100)), num_buckets=4).boundaries
    (25, 50, 75)
    """

    def __init__(
        self,
        lengths: npt.ArrayLike,
        boundaries: Sequence[int] | None = None,
        num_buckets: int | None = None,
    ) -> None:
        values = np.asarray(lengths)
        if values.ndim != 1 or not (values.size == 0 or np.issubdtype(values.dtype, np.integer)):
            raise ValueError(
                f"lengths must be a 1-D array of ints, one per record; got dtype {values.dtype} "
                f"and shape {values.shape}"
            )
        if values.size and values.min() < 0:
            raise ValueError(f"lengths must be >= 0, got {int(values.min())}")
        if (boundaries is None) == (num_buckets is None):
            raise ValueError("bucket_by_length takes boundaries or num_buckets, exactly one")
        if boundaries is None:
            count = require_int("num_buckets", num_buckets, minimum=1)
            bounds = _equal_count_boundaries(values, count)
        else:
            bounds = tuple(
                require_int("a bucket boundary", bound, minimum=1) for bound in boundaries
            )
            if any(later <= earlier for earlier, later in itertools.pairwise(bounds)):
                raise ValueError(f"bucket boundaries must ascend, got {list(bounds)}")
        self.boundaries = bounds
        label_type = np.uint8 if len(bounds) < 2**8 else np.uint16
        if len(bounds) >= 2**16:
            raise ValueError(f"at most 65,535 bucket boundaries, got {len(bounds)}")
        labels = np.searchsorted(np.asarray(bounds), values, side="right").astype(label_type)
        self.sizes: IndexArray = np.bincount(labels, minlength=len(bounds) + 1).astype(np.int64)
        index_type = np.int32 if values.size < 2**31 else np.int64
        # A stable sort of small ints is a radix sort: linear in the records.
        self.members = np.argsort(labels, kind="stable").astype(index_type)
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)))
        digest = hashlib.blake2b(np.asarray(bounds, dtype="<i8").tobytes(), digest_size=16)
        digest.update(labels.tobytes())
        self.digest = digest.hexdigest()
        self._tables: collections.OrderedDict[Any, Table] = collections.OrderedDict()
        self._lock = threading.Lock()

    @property
    def num_records(self) -> int:
        return int(self.starts[-1])

    def describe(self) -> dict[str, Any]:
        """What makes the buckets what they are: the boundaries and a digest of every record's
        bucket (two arrays of lengths that bucket alike describe alike)."""
        return {"boundaries": list(self.boundaries), "digest": self.digest}

    def order(
        self, num_records: int, seed: int, shuffle: bool, drop_remainder: bool
    ) -> BucketOrder:
        """The epochs of a plan of `num_records` records over these buckets."""
        if num_records != self.num_records:
            raise ValueError(
                f"bucket_by_length has {self.num_records} lengths, but the dataset has "
                f"{num_records} records: one length per record"
            )
        return BucketOrder(self, seed, shuffle, drop_remainder)

    def table(self, key: Any, batches: npt.NDArray[np.int64]) -> Table:
        """For each step of a part of an epoch with `batches` per bucket: its bucket, and how
        many of that bucket's batches come before it. Keyed random, kept for a few parts."""
        with self._lock:
            found = self._tables.get(key)
            if found is not None:
                self._tables.move_to_end(key)
                return found
        total = int(batches.sum())
        ends = np.cumsum(batches)
        slots = permute(np.arange(total, dtype=np.int64), total, derive_key(*key))
        labels = np.searchsorted(ends, slots, side="right").astype(np.int64)
        ranked = np.argsort(labels, kind="stable")
        before = np.empty(total, dtype=np.int64)
        before[ranked] = np.arange(total) - (ends - batches)[labels[ranked]]
        with self._lock:
            self._tables[key] = (labels, before)
            while len(self._tables) > _TABLES:
                self._tables.popitem(last=False)
        return labels, before

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LengthBuckets) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"LengthBuckets(boundaries={list(self.boundaries)}, digest={self.digest[:12]})"


@dataclasses.dataclass(frozen=True, slots=True)
class BucketOrder(EpochOrder[BucketCursor]):
    """An epoch of length buckets; its cursor counts the records delivered of each bucket.

    >>> import numpy as np
    >>> from loadax.plan.buckets import LengthBuckets
    >>> buckets = LengthBuckets([1, 9, 2, 8, 3, 7], boundaries=[5])
    >>> order = buckets.order(6, seed=0, shuffle=False, drop_remainder=False)
    >>> order.steps_left((0, 0), 2)
    4
    >>> lengths = [order.batch_length(0, (0, 0), 2, t) for t in range(4)]
    >>> sorted(order.records(0, (0, 0), 2, t, np.arange(n)).tolist() for t, n in enumerate(lengths))
    [[0, 2], [1, 3], [4], [5]]
    """

    buckets: LengthBuckets
    seed: int
    shuffle: bool
    drop_remainder: bool

    @property
    def zero(self) -> BucketCursor:
        return (0,) * self.buckets.sizes.size

    def steps_left(self, cursor: BucketCursor, size: int) -> int:
        return int(self._batches(cursor, size).sum())

    def batch_length(self, epoch: int, cursor: BucketCursor, size: int, step: int) -> int:
        bucket, first = self._batch(epoch, cursor, size, step)
        return int(min(size, self.buckets.sizes[bucket] - first))

    def records(
        self, epoch: int, cursor: BucketCursor, size: int, step: int, positions: IndexArray
    ) -> IndexArray:
        bucket, first = self._batch(epoch, cursor, size, step)
        positions = positions + first
        if self.shuffle:
            key = derive_key(KeyPurpose.BUCKET_SHUFFLE, self.seed, epoch, bucket)
            positions = permute(positions, int(self.buckets.sizes[bucket]), key)
        start = int(self.buckets.starts[bucket])
        return self.buckets.members[start + positions].astype(np.int64)

    def advance(self, epoch: int, cursor: BucketCursor, size: int, steps: int) -> BucketCursor:
        if not steps:
            return cursor
        labels, _ = self._table(epoch, cursor, size)
        taken = np.bincount(labels[:steps], minlength=len(cursor)) * size
        delivered = np.minimum(self.buckets.sizes, np.asarray(cursor) + taken)
        return tuple(delivered.tolist())

    def lengths(self, cursor: BucketCursor, size: int) -> set[int]:
        full, short = np.divmod(self.buckets.sizes - np.asarray(cursor), size)
        lengths = {size} if full.any() else set()
        return lengths if self.drop_remainder else lengths | set(short[short > 0].tolist())

    def check_cursor(self, cursor: Any) -> BucketCursor:
        sizes = self.buckets.sizes.tolist()
        if (
            not isinstance(cursor, list | tuple)
            or len(cursor) != len(sizes)
            or not all(
                type(value) is int and 0 <= value <= size
                for value, size in zip(cursor, sizes, strict=True)
            )
        ):
            raise ValueError(
                f"the records delivered of the epoch must be one int per length bucket, within "
                f"the buckets' sizes {sizes}; got {cursor!r}"
            )
        return tuple(cursor)

    def _batches(self, cursor: BucketCursor, size: int) -> npt.NDArray[np.int64]:
        left = self.buckets.sizes - np.asarray(cursor, dtype=np.int64)
        return left // size if self.drop_remainder else -(-left // size)

    def _table(self, epoch: int, cursor: BucketCursor, size: int) -> Table:
        key = (KeyPurpose.BUCKET_ORDER, self.seed, epoch, size, int(self.drop_remainder), *cursor)
        return self.buckets.table(key, self._batches(cursor, size))

    def _batch(self, epoch: int, cursor: BucketCursor, size: int, step: int) -> tuple[int, int]:
        """The bucket of batch `step` of the part, and its first position in the bucket."""
        labels, before = self._table(epoch, cursor, size)
        bucket = int(labels[step])
        return bucket, cursor[bucket] + int(before[step]) * size


def _equal_count_boundaries(lengths: npt.NDArray[Any], count: int) -> tuple[int, ...]:
    """Boundaries that split `lengths` into `count` buckets of about equal counts (fewer when
    many records share a length)."""
    if not lengths.size or count == 1:
        return ()
    quantiles = np.quantile(lengths, np.arange(1, count) / count, method="higher")
    bounds = np.unique(quantiles)
    return tuple(int(bound) for bound in bounds[bounds > lengths.min()])


@dataclasses.dataclass(frozen=True, slots=True)
class LengthsOf:
    """Length buckets still to be made: `length` gives a record's length, called once per
    record when the loader is built (on the records as epoch 0 reads them)."""

    length: Callable[[Any], int]
    boundaries: tuple[int, ...] | None
    num_buckets: int | None

    def buckets(
        self, num_records: int, read: Callable[[IndexArray], Sequence[Any]]
    ) -> LengthBuckets:
        """The buckets of the `num_records` records that `read` reads (by their indices), a
        failure naming the record whose length failed."""
        lengths = np.empty(num_records, dtype=np.int64)
        for start in range(0, num_records, _READ_CHUNK):
            indices = np.arange(start, min(start + _READ_CHUNK, num_records), dtype=np.int64)
            for index, record in zip(indices.tolist(), read(indices), strict=True):
                try:
                    lengths[index] = self.length(record)
                except Exception as error:
                    raise ValueError(
                        f"bucket_by_length's function failed on record {index}: {error!r}"
                    ) from error
        return LengthBuckets(lengths, self.boundaries, self.num_buckets)
