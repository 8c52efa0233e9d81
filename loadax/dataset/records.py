"""`Records`: how loadax's own datasets are read, and `read_records`, which reads any dataset.

A loadax dataset has Python's indexing rules over one batched read that knows the epoch a read
belongs to, so that per-epoch shuffles and per-record random maps are a pure function of (seed,
epoch, record index). `DatasetBase` adds the chainable transforms to it.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
from typing_extensions import TypeVar

from loadax.dataset.protocol import Dataset
from loadax.dataset.stream import Stream
from loadax.plan.permutation import IndexArray

T = TypeVar("T", default=Any)


def read_records(dataset: Dataset[T], indices: IndexArray, epoch: int = 0) -> list[T]:
    """The records at `indices` (valid, non-negative) of any dataset, as read in `epoch`.

    >>> import numpy as np
    >>> from loadax import read_records
    >>> read_records(["a", "b", "c"], np.array([2, 0]))
    ['c', 'a']
    """
    if isinstance(dataset, Records):
        return dataset.read(indices, epoch)
    get_many = getattr(dataset, "__getitems__", None)
    if get_many is not None:
        return list(get_many(indices.tolist()))
    return [dataset[index] for index in indices.tolist()]


class Records(Dataset[T], abc.ABC):
    """A dataset read by `read(indices, epoch)`, with Python's indexing rules on top of it.

    The base of `DatasetBase`, which adds the transforms; subclass that.

    >>> import numpy as np
    >>> from loadax.dataset.records import Records
    >>> class Letters(Records[str]):
    ...     def __len__(self) -> int:
    ...         return 3
    ...     def read(self, indices, epoch):
    ...         return ["abc"[i] + str(epoch) for i in indices.tolist()]
    >>> letters = Letters()
    >>> letters[-1], list(letters), letters.read(np.array([1]), epoch=2)
    ('c0', ['a0', 'b0', 'c0'], ['b2'])
    """

    keyed_by_epoch: ClassVar[bool] = False
    """True for the ops whose records depend on the epoch itself (shuffles, random maps)."""
    reads_same_indices: ClassVar[bool] = False
    """True for the ops whose record i is made of their dataset's record i (maps)."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        """The records at `indices` (already checked to lie in [0, len)) as read in `epoch`."""

    def __getitem__(self, index: int, /) -> T:
        return self.read(np.array([self._normalise(index)], dtype=np.int64), 0)[0]

    def __getitems__(self, indices: Sequence[int], /) -> list[T]:
        return self.read(np.array([self._normalise(i) for i in indices], dtype=np.int64), 0)

    def __iter__(self) -> Iterator[T]:
        return (self[index] for index in range(len(self)))

    def will_read(self, starts: IndexArray, stops: IndexArray) -> None:
        """Records `[starts[i], stops[i])` will be read soon, in any order (a block shuffle's
        window): a source that reads better in large requests may fetch them now. A map passes
        it on to its dataset; other datasets ignore it."""
        if self.reads_same_indices:
            for parent in self._parents():
                will_read(parent, starts, stops)

    def _parents(self) -> tuple[Dataset[Any], ...]:
        """The datasets this one reads its records from (none for a source)."""
        return ()

    def _normalise(self, index: int) -> int:
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"{type(self).__name__} indices must be ints, not {type(index).__name__}"
            ) from None
        size = len(self)
        if position < 0:
            position += size
        if not 0 <= position < size:
            raise IndexError(f"index {index} is out of range for {type(self).__name__} of {size}")
        return position


def will_read(dataset: object, starts: IndexArray, stops: IndexArray) -> None:
    """Tell `dataset` that records `[starts[i], stops[i])` will be read soon
    (`Records.will_read`); a dataset that is no loadax dataset is not told."""
    if isinstance(dataset, Records):
        dataset.will_read(starts, stops)


def varies_by_epoch(dataset: object) -> bool:
    """True when `dataset` reads other records in one epoch than in another: a shuffle or a
    random map somewhere in it (a dataset loadax does not know is taken not to).

    >>> from loadax import RangeDataset
    >>> from loadax.dataset.records import varies_by_epoch
    >>> varies_by_epoch(RangeDataset(0, 4).map(str)), varies_by_epoch(RangeDataset(0, 4).shuffle())
    (False, True)
    """
    if isinstance(dataset, Stream):
        return varies_by_epoch(dataset.dataset)
    if not isinstance(dataset, Records):
        return False
    return dataset.keyed_by_epoch or any(varies_by_epoch(parent) for parent in dataset._parents())


def read_grouped(groups: IndexArray, read: Callable[[int, IndexArray], list[T]]) -> list[T]:
    """`read(group, positions)` once per group of `groups`, the records put back in order."""
    if len(groups) == 0:
        return []
    order = np.argsort(groups, kind="stable")
    keys, firsts = np.unique(groups[order], return_index=True)
    grouped: list[T] = []
    for key, chosen in zip(keys.tolist(), np.split(order, firsts[1:]), strict=True):
        grouped.extend(read(key, chosen))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return [grouped[position] for position in inverse.tolist()]
