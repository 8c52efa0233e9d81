"""`ZippedDataset`: equal-length datasets joined record by record, into tuples or dicts."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, overload

from typing_extensions import TypeVar

from loadax.dataset.ops import DatasetBase
from loadax.dataset.protocol import Dataset, as_dataset, dataset_length
from loadax.dataset.records import read_records
from loadax.plan.permutation import IndexArray

T = TypeVar("T", default=Any)

_PARTS = reprlib.Repr()
# A part's repr is shown whole unless it is long: a list of a million labels is not.
_PARTS.maxother = 200
_PARTS.maxlist = _PARTS.maxtuple = 6


class ZippedDataset(DatasetBase[T]):
    """Record i of each of `datasets` together: a tuple for a sequence of datasets, a dict for a
    mapping (with the mapping's keys).

    The datasets must have one length. A batched read reads each dataset once, with its own
    batched read (`read` or `__getitems__`) of the batch's indices, never record by record; every
    part is read in the same epoch, so a shuffled part stays shuffled the same way as it would be
    alone.

    >>> import numpy as np
    >>> from loadax import InMemoryDataset, RangeDataset, ZippedDataset
    >>> images = InMemoryDataset(np.arange(6).reshape(3, 2))
    >>> pairs = ZippedDataset([RangeDataset(10, 13), ["a", "b", "c"]])
    >>> pairs[1]
    (11, 'b')
    >>> records = ZippedDataset({"image": images, "label": [0, 1, 0]})
    >>> record = records[2]
    >>> record["image"].tolist(), record["label"]
    ([4, 5], 0)
    >>> records.map(lambda r: r["label"]).shuffle(seed=0)[0]
    0
    >>> ZippedDataset([RangeDataset(0, 3), [1, 2]])
    Traceback (most recent call last):
    ...
    ValueError: ZippedDataset: the datasets must have one length, got datasets[0]: 3, datasets[1]: 2
    """

    @overload
    def __init__(
        self: ZippedDataset[dict[str, Any]], datasets: Mapping[str, Dataset[Any]]
    ) -> None: ...
    @overload
    def __init__(
        self: ZippedDataset[tuple[Any, ...]], datasets: Sequence[Dataset[Any]]
    ) -> None: ...
    def __init__(self, datasets: Mapping[str, Dataset[Any]] | Sequence[Dataset[Any]]) -> None:
        if isinstance(datasets, Mapping):
            self._keys: tuple[Any, ...] | None = tuple(datasets)
            parts = tuple(datasets.values())
        elif isinstance(datasets, Sequence) and not isinstance(datasets, str | bytes):
            self._keys = None
            parts = tuple(datasets)
        else:
            raise ValueError(
                "ZippedDataset: datasets must be a sequence or a mapping of datasets, got "
                f"{type(datasets).__name__}"
            )
        if not parts:
            raise ValueError("ZippedDataset: datasets must not be empty")
        self._parts = parts
        adopted, lengths = [], []
        for name, part in zip(self._names(), parts, strict=True):
            try:
                adopted.append(as_dataset(part))
                lengths.append(dataset_length(adopted[-1]))
            except ValueError as error:
                raise ValueError(f"ZippedDataset: dataset {name}: {error}") from None
        self._parts = tuple(adopted)
        if len(set(lengths)) > 1:
            shown = ", ".join(
                f"{name}: {length}" for name, length in zip(self._names(), lengths, strict=True)
            )
            raise ValueError(f"ZippedDataset: the datasets must have one length, got {shown}")
        self._length = lengths[0]

    def __len__(self) -> int:
        return self._length

    @property
    def datasets(self) -> dict[str, Dataset[Any]] | tuple[Dataset[Any], ...]:
        """The zipped datasets: a dict of them for a mapping, else a tuple."""
        if self._keys is None:
            return self._parts
        return dict(zip(self._keys, self._parts, strict=True))

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        columns = [read_records(part, indices, epoch) for part in self._parts]
        for name, column in zip(self._names(), columns, strict=True):
            if len(column) != len(indices):  # zip below would hide it
                raise ValueError(
                    f"ZippedDataset: dataset {name} gave {len(column)} records for a read of "
                    f"{len(indices)}"
                )
        rows = zip(*columns, strict=True)
        if self._keys is None:
            return list(rows)  # type: ignore[arg-type]
        keys = self._keys
        return [dict(zip(keys, row, strict=True)) for row in rows]  # type: ignore[misc]

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return tuple(self._parts)

    def __repr__(self) -> str:
        if self._keys is None:
            return f"ZippedDataset([{', '.join(_PARTS.repr(part) for part in self._parts)}])"
        shown = ", ".join(
            f"{key!r}: {_PARTS.repr(part)}"
            for key, part in zip(self._keys, self._parts, strict=True)
        )
        return f"ZippedDataset({{{shown}}})"

    def _names(self) -> list[str]:
        """How errors name each part: its key, or its position."""
        if self._keys is None:
            return [f"datasets[{position}]" for position in range(len(self._parts))]
        return [repr(key) for key in self._keys]
