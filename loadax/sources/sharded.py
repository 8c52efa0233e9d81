"""Record files in shards (tar, TFRecord) as a random-access dataset: each shard located by an
index built once and cached (`shards.IndexCache`), and each batch read by ranged reads, records
near each other in a shard in one request."""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from functools import partial
from typing import Any, BinaryIO, cast

import numpy as np
from typing_extensions import TypeVar

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.retries import RetryPolicy
from loadax.sources.shards import Index, IndexCache, Shards

T = TypeVar("T", default=Any)

_GAP = 64 << 10  # records this close together in a local shard are read in one request
# In a store, a request costs its time to first byte: records closer than that many bytes take
# less time to read through (Arrow's rule for coalescing: hole = latency x bandwidth, which is
# 1-3 MB for S3; moto spends ~5 ms of CPU on a GET and well under 1 ms on a MiB).
_STORE_GAP = 1 << 20
_LONGEST_READ = 64 << 20  # but no request longer than this


class ShardedDataset(DatasetBase[T], abc.ABC):
    """The records of shards, shard after shard, each shard's located by its index.

    A subclass says how a shard is indexed (`build_index`), how many records an index holds
    (`count`), where each record's bytes lie (`spans`) and what a record is made of its bytes
    (`record`); this class lists and fingerprints the shards, caches the indexes, and reads each
    batch's records with ranged reads (records near each other in a shard in one request).
    """

    kind = "shard"
    """The name of the index format, in the cached files' names."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        filesystem: Any,
        retries: RetryPolicy,
        index_dir: str | os.PathLike[str] | None,
    ) -> None:
        source = type(self).__name__
        self.shards = Shards(paths, filesystem, retries, source)
        self.index_dir = index_dir
        cache = IndexCache(index_dir, self.kind, source)
        self.indexes: list[Index] = []
        for shard, fingerprint in enumerate(self.shards.fingerprints()):
            build = partial(self._scanned, shard, fingerprint[0])
            self.indexes.append(cache.get(self.shards.names[shard], fingerprint, build))
        counts = np.array([self.count(index) for index in self.indexes], dtype=np.int64)
        self._ends = np.cumsum(counts)  # one past the last global index of each shard
        self._starts = self._ends - counts

    @abc.abstractmethod
    def build_index(self, shard: int, file: BinaryIO, size: int) -> Index:
        """The index of shard `shard`, read from `file` (at its start; `size` bytes long)."""

    @abc.abstractmethod
    def count(self, index: Index) -> int:
        """The number of records `index` holds."""

    @abc.abstractmethod
    def spans(self, shard: int, records: IndexArray) -> tuple[IndexArray, IndexArray]:
        """The byte ranges `[starts, ends)` of `records` (numbers within the shard)."""

    @abc.abstractmethod
    def record(self, shard: int, number: int, data: memoryview, offset: int) -> T:
        """Record `number` of shard `shard`, made of its bytes `data` (which start at `offset`)."""

    def __len__(self) -> int:
        return int(self._ends[-1])

    @property
    def paths(self) -> tuple[str, ...]:
        """The shards, in order: absolute local paths, or the objects' URLs."""
        return self.shards.names

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        records: list[Any] = [None] * len(indices)
        owners = np.searchsorted(self._ends, indices, side="right")
        requests: list[tuple[int, int, int]] = []  # (shard, offset, size)
        # Of each request: the positions in `indices` of its records, their numbers in the
        # shard, and where their bytes start and end.
        contents: list[tuple[IndexArray, IndexArray, IndexArray, IndexArray]] = []
        gap = _GAP if self.shards.store is None else _STORE_GAP
        for shard in np.unique(owners).tolist():
            (positions,) = np.nonzero(owners == shard)
            numbers = indices[positions] - self._starts[shard]
            starts, ends = self.spans(shard, numbers)
            order = np.argsort(starts, kind="stable")
            for group in _requests(starts[order], ends[order], gap):
                members = order[group]
                first, last = int(starts[members[0]]), int(ends[members].max())
                requests.append((shard, first, last - first))
                contents.append(
                    (positions[members], numbers[members], starts[members], ends[members])
                )
        for request, data in self.shards.fetch(requests):  # each request's as it arrives
            shard, first, _ = requests[request]
            view = memoryview(data)
            for position, number, start, end in zip(
                *(part.tolist() for part in contents[request]), strict=True
            ):
                records[position] = self.record(
                    shard, number, view[start - first : end - first], start
                )
        return cast(list[T], records)

    def will_read(self, starts: IndexArray, stops: IndexArray) -> None:
        """From a store, fetch the bytes of records `[starts[i], stops[i])` (a block shuffle's
        window) in large reads, to serve their reads (`Shards.expect`); a local file is read
        ahead by the OS."""
        if self.shards.store is None:
            return
        spans: list[tuple[int, int, int]] = []  # (shard, start, end) in bytes
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            first = int(np.searchsorted(self._ends, start, side="right"))
            last = int(np.searchsorted(self._ends, stop - 1, side="right"))
            for shard in range(first, last + 1):
                offset = int(self._starts[shard])
                numbers = np.arange(max(start, offset), min(stop, int(self._ends[shard])))
                begins, ends = self.spans(shard, numbers - offset)
                if begins.size and ends.max() > begins.min():
                    spans.append((shard, int(begins.min()), int(ends.max())))
        self.shards.expect(spans)

    def close(self) -> None:
        """Close every thread's open shards and end the fetching threads; later reads open
        and start them again."""
        self.shards.close()

    def _scanned(self, shard: int, size: int) -> Index:
        with self.shards.scan(shard) as file:
            return self.build_index(shard, file, size)


def _requests(starts: IndexArray, ends: IndexArray, gap: int) -> list[IndexArray]:
    """Spans sorted by start, grouped into requests: a span joins the previous request when it
    starts within `gap` bytes of its end and the request stays under `_LONGEST_READ`."""
    groups: list[list[int]] = []
    request_start = request_end = 0
    for position, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if groups and start <= request_end + gap and end - request_start <= _LONGEST_READ:
            groups[-1].append(position)
            request_end = max(request_end, end)
        else:
            groups.append([position])
            request_start, request_end = start, end
    return [np.array(group, dtype=np.int64) for group in groups]
