"""`DatasetBase`, and the lazy transforms that keep a dataset random-access.

Each transform is a dataset whose `read` reads its parents' records (see `records`); the
transforms and `DatasetBase`, whose methods make them, refer to each other, so they share a file.
Those that only rearrange records keep their index arithmetic in `loadax.dataset.structure`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeVar

from loadax.dataset.cache import RecordCache
from loadax.dataset.names import callable_name, dataset_repr, op_repr
from loadax.dataset.packing import PackedRow, PackingStrategy
from loadax.dataset.protocol import Dataset, ReadsRows, as_dataset, dataset_length, reads_rows
from loadax.dataset.records import Records, read_records, varies_by_epoch
from loadax.dataset.stream import Stream
from loadax.dataset.structure import ConcatenatedRecords, RepeatedRecords, SlicedRecords
from loadax.plan.permutation import IndexArray, KeyPurpose, derive_key, permute, record_rng
from loadax.reuse import ReuseStats
from loadax.validation import require_int

T = TypeVar("T", default=Any)
U = TypeVar("U", default=Any)


class DatasetBase(Records[T]):
    """Base of loadax's datasets: Python indexing rules, batched reads and chainable transforms.

    A subclass defines `__len__` and `read`:

    >>> from loadax import DatasetBase
    >>> class Squares(DatasetBase[int]):
    ...     def __len__(self) -> int:
    ...         return 5
    ...     def read(self, indices, epoch):
    ...         return [i * i for i in indices.tolist()]
    >>> squares = Squares()
    >>> squares[-1], list(squares.map(str).slice(1, 3))
    (16, ['1', '4'])
    >>> squares.map(str).slice(1, 3)
    Squares(<5 records>).map(str).slice(1, 3)
    """

    def __repr__(self) -> str:
        """How the dataset was written: its source, then each op as a method call."""
        return f"{type(self).__name__}(<{len(self)} records>)"

    def map(self, fn: Callable[[T], U]) -> MappedDataset[U]:
        """Apply `fn` to every record, lazily.

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 3).map(lambda x: x * 10))
        [0, 10, 20]
        """
        return MappedDataset(self, fn)

    def random_map(
        self, fn: Callable[[T, np.random.Generator], U], seed: int | None = None
    ) -> RandomMappedDataset[U]:
        """Apply `fn(record, rng)`, with `rng` keyed by (seed, epoch, record index).

        A record gets the same draws on every read, in any process:

        >>> from loadax import RangeDataset
        >>> def jitter(x, rng):
        ...     return x + int(rng.integers(100))
        >>> noisy = RangeDataset(0, 3).random_map(jitter, seed=0)
        >>> list(noisy), list(noisy)
        ([81, 68, 4], [81, 68, 4])
        """
        return RandomMappedDataset(self, fn, seed)

    def shuffle(self, seed: int | None = None) -> ShuffledDataset[T]:
        """Visit the records in a keyed random order, different in every epoch.

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 6).shuffle(seed=2))
        [4, 5, 2, 1, 0, 3]
        """
        return ShuffledDataset(self, seed)

    def slice(
        self, start: int | None = None, stop: int | None = None, step: int | None = None
    ) -> SlicedDataset[T]:
        """The records of `self[start:stop:step]`, lazily.

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 10).slice(1, None, 4))
        [1, 5, 9]
        """
        return SlicedDataset(self, start, stop, step)

    def take(self, count: int) -> SlicedDataset[T]:
        """The first `count` records (all of them when there are fewer): `slice(0, count)`.

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 10).take(3)), len(RangeDataset(0, 2).take(5))
        ([0, 1, 2], 2)
        """
        return SlicedDataset(self, 0, require_int("take", count, minimum=0))

    def skip(self, count: int) -> SlicedDataset[T]:
        """The records after the first `count` (none when there are fewer): `slice(count, None)`.

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 10).skip(7)), len(RangeDataset(0, 2).skip(5))
        ([7, 8, 9], 0)
        """
        return SlicedDataset(self, require_int("skip", count, minimum=0))

    def cache(
        self, path: str | os.PathLike[str] | None = None, max_bytes: int | None = None
    ) -> CachedDataset[T]:
        """Keep each record once read, so that later epochs skip the work before it (decoding,
        maps): in memory, or with `path` in files (a folder, `file:///...`, `s3://...`), at most
        `max_bytes` (see `loadax.dataset.cache`). Only before any shuffle or random map.

        >>> from loadax import RangeDataset
        >>> calls = []
        >>> cached = RangeDataset(0, 3).map(lambda x: calls.append(x) or x * 10).cache()
        >>> list(cached), list(cached), calls
        ([0, 10, 20], [0, 10, 20], [0, 0, 1, 2])
        """
        return CachedDataset(self, path, max_bytes)

    def concatenate(self, *others: Dataset[T]) -> ConcatenatedDataset[T]:
        """The records of `self`, then those of each of `others` in turn.

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 2).concatenate([10, 11], RangeDataset(5, 6)))
        [0, 1, 10, 11, 5]
        """
        return ConcatenatedDataset([self, *others])

    def repeat(self, count: int) -> RepeatedDataset[T]:
        """The records `count` times over; each pass reads as its own epoch (new shuffle, rng).

        >>> from loadax import RangeDataset
        >>> list(RangeDataset(0, 3).shuffle(seed=3).repeat(2))
        [2, 1, 0, 0, 2, 1]
        """
        return RepeatedDataset(self, count)

    def filter(self, predicate: Callable[[T], bool]) -> Stream[T]:
        """A stream of the records for which `predicate` is True (no longer random-access).

        A loader batches the records that survive:

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> evens = RangeDataset(0, 10).filter(lambda x: x % 2 == 0)
        >>> [batch.tolist() for batch in DataLoader(Batcher()).batch_size(2).build(evens)]
        [[0, 2], [4, 6], [8]]
        """
        return Stream(self).filter(predicate)

    def pack(
        self,
        length: int,
        *,
        pad_value: int | float = 0,
        truncate: bool = False,
        strategy: PackingStrategy = "first_fit",
    ) -> Stream[PackedRow]:
        """A stream of token sequences packed into rows of `length` (see Stream.pack).

        >>> from loadax import Batcher, DataLoader, InMemoryDataset
        >>> packed = InMemoryDataset([[1, 2, 3], [4, 5], [6, 7, 8, 9]]).pack(5)
        >>> batch = next(iter(DataLoader(Batcher()).batch_size(2).build(packed)))
        >>> batch["tokens"].tolist()
        [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
        >>> batch["segment_ids"].tolist()
        [[1, 1, 1, 2, 2], [1, 1, 1, 1, 0]]
        """
        return Stream(self).pack(length, pad_value=pad_value, truncate=truncate, strategy=strategy)


def _seed(seed: int | None) -> int:
    # None is the fixed default seed 0, not fresh entropy: a pipeline must be reproducible.
    return 0 if seed is None else require_int("seed", seed, minimum=0)


class MappedDataset(DatasetBase[U]):
    """`fn` applied lazily to each record of `dataset`.

    >>> from loadax import MappedDataset
    >>> list(MappedDataset([1, 2, 3], str))
    ['1', '2', '3']
    """

    reads_same_indices = True

    def __init__(self, dataset: Dataset[T], fn: Callable[[T], U]) -> None:
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {fn!r}")
        self._dataset, self._fn = as_dataset(dataset), fn
        self._length = dataset_length(self._dataset)

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[U]:
        return [self._fn(record) for record in read_records(self._dataset, indices, epoch)]

    def __repr__(self) -> str:
        return op_repr(self._dataset, "map", "MappedDataset", callable_name(self._fn))

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return (self._dataset,)


class RandomMappedDataset(DatasetBase[U]):
    """`fn(record, rng)` applied lazily; `rng` depends only on (seed, epoch, record index).

    >>> import numpy as np
    >>> from loadax import RandomMappedDataset
    >>> tagged = RandomMappedDataset(["a", "b", "c"], lambda x, rng: x + str(rng.integers(10)))
    >>> tagged.read(np.arange(3), epoch=0), tagged.read(np.arange(3), epoch=1)
    (['a8', 'b6', 'c0'], ['a2', 'b6', 'c7'])
    """

    keyed_by_epoch = True
    reads_same_indices = True

    def __init__(
        self,
        dataset: Dataset[T],
        fn: Callable[[T, np.random.Generator], U],
        seed: int | None = None,
    ) -> None:
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {fn!r}")
        self._dataset, self._fn = as_dataset(dataset), fn
        self._length = dataset_length(self._dataset)
        self._seed = _seed(seed)

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[U]:
        records = read_records(self._dataset, indices, epoch)
        return [
            self._fn(record, record_rng(self._seed, epoch, index))
            for record, index in zip(records, indices.tolist(), strict=True)
        ]

    def __repr__(self) -> str:
        arguments = f"{callable_name(self._fn)}, seed={self._seed}"
        return op_repr(self._dataset, "random_map", "RandomMappedDataset", arguments)

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return (self._dataset,)


class ShuffledDataset(DatasetBase[T]):
    """`dataset` in a keyed random order, reshuffled in every epoch; no O(n) table.

    >>> import numpy as np
    >>> from loadax import ShuffledDataset
    >>> shuffled = ShuffledDataset(["a", "b", "c", "d"], seed=1)
    >>> shuffled.read(np.arange(4), epoch=0), shuffled.read(np.arange(4), epoch=1)
    (['c', 'd', 'b', 'a'], ['b', 'c', 'a', 'd'])
    """

    keyed_by_epoch = True

    def __init__(self, dataset: Dataset[T], seed: int | None = None) -> None:
        self._dataset, self._seed = as_dataset(dataset), _seed(seed)
        self._length = dataset_length(self._dataset)

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        return read_records(self._dataset, self._parent(indices, epoch), epoch)

    @property
    def reads_rows(self) -> bool:
        return reads_rows(self._dataset)

    def read_rows(self, indices: IndexArray, epoch: int) -> npt.NDArray[Any]:
        return cast(ReadsRows, self._dataset).read_rows(self._parent(indices, epoch), epoch)

    def _parent(self, indices: IndexArray, epoch: int) -> IndexArray:
        key = derive_key(KeyPurpose.DATASET_SHUFFLE, self._seed, epoch)
        return permute(indices, self._length, key)

    def __repr__(self) -> str:
        return op_repr(self._dataset, "shuffle", "ShuffledDataset", f"seed={self._seed}")

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return (self._dataset,)


class SlicedDataset(SlicedRecords[T], DatasetBase[T]):
    """`dataset[start:stop:step]` with Python's slicing rules, read lazily in one batched call.

    >>> from loadax import SlicedDataset
    >>> list(SlicedDataset(range(10), 1, 8, 3))
    [1, 4, 7]
    """


class CachedDataset(DatasetBase[T]):
    """The records of `dataset`, kept once read (`DatasetBase.cache`); `stats()` says what that
    saved in this process.

    >>> from loadax import CachedDataset, RangeDataset
    >>> CachedDataset(RangeDataset(0, 4).random_map(lambda x, rng: x))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: cache() keeps a record across epochs, but ...random_map(<lambda>, seed=0) reads...
    """

    def __init__(
        self,
        dataset: Dataset[T],
        path: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._dataset = as_dataset(dataset)
        if varies_by_epoch(self._dataset):
            raise ValueError(
                f"cache() keeps a record across epochs, but {dataset_repr(self._dataset)} reads "
                "other records in each epoch (a shuffle or random_map in it): cache() before it"
            )
        self._length = dataset_length(self._dataset)
        self.record_cache = RecordCache(path, max_bytes)
        """Where its records are kept."""

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        return self.record_cache.read(self._dataset, indices, epoch)

    def stats(self) -> ReuseStats:
        """Hits, misses, bytes saved and the bytes kept, in this process."""
        return self.record_cache.stats()

    def __repr__(self) -> str:
        cache = self.record_cache
        options = [] if cache.location is None else [repr(cache.location)]
        if cache.max_bytes is not None:
            options.append(f"max_bytes={cache.max_bytes}")
        return op_repr(self._dataset, "cache", "CachedDataset", ", ".join(options))

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return (self._dataset,)


class ConcatenatedDataset(ConcatenatedRecords[T], DatasetBase[T]):
    """The records of each of `datasets` in turn; each dataset is read once per batched read.

    >>> from loadax import ConcatenatedDataset
    >>> list(ConcatenatedDataset([[1, 2], [3]]))
    [1, 2, 3]
    """


class RepeatedDataset(RepeatedRecords[T], DatasetBase[T]):
    """`dataset` `count` times over; pass p of epoch e reads `dataset` as epoch e * count + p.

    >>> from loadax import RepeatedDataset
    >>> list(RepeatedDataset(["a", "b"], 2))
    ['a', 'b', 'a', 'b']
    """
