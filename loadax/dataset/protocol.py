"""The dataset contract: what a loader reads records from, and the optional batched-row read.

Anything with `__len__` and `__getitem__(int)` is a dataset (a list, a numpy array, a
`tfds.data_source`); `__getitems__(indices)` is used for batched reads when present. A Hugging Face
`datasets.Dataset` is read through `HuggingFaceDataset`, so that its columns arrive as arrays.
A dataset whose records are the rows of an array can also read a whole batch as one array.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy.typing as npt
from typing_extensions import TypeVar

from loadax.plan.permutation import IndexArray
from loadax.validation import require_int

T_co = TypeVar("T_co", covariant=True, default=Any)
R = TypeVar("R")


@runtime_checkable
class Dataset(Protocol[T_co]):
    """A sized, random-access collection of records.

    >>> from loadax import Dataset
    >>> isinstance([1, 2, 3], Dataset), isinstance(iter([1, 2, 3]), Dataset)
    (True, False)
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> T_co: ...


@runtime_checkable
class ReadsRows(Protocol):
    """A dataset that can read a batch of its records as one array, when `reads_rows` is True.

    `read_rows(indices, epoch)` equals stacking the records, without touching each in Python.

    >>> import numpy as np
    >>> from loadax import InMemoryDataset
    >>> from loadax.dataset.protocol import reads_rows
    >>> rows = InMemoryDataset(np.arange(12).reshape(6, 2))
    >>> reads_rows(rows), reads_rows(rows.map(str)), rows.read_rows(np.array([4, 1]), 0).tolist()
    (True, False, [[8, 9], [2, 3]])
    """

    @property
    def reads_rows(self) -> bool:
        """True when `read_rows` works for this dataset (a wrapper: when its parent's does)."""
        ...

    def read_rows(self, indices: IndexArray, epoch: int) -> npt.NDArray[Any]:
        """The records at `indices` (in [0, len)) as read in `epoch`, stacked by one read."""
        ...


def reads_rows(dataset: object) -> bool:
    """True when `dataset` reads a batch of records as one array (`ReadsRows`)."""
    return isinstance(dataset, ReadsRows) and dataset.reads_rows


def require_dataset(
    dataset: Any, problem: str = "dataset must have __len__ and __getitem__"
) -> Dataset[Any]:
    """`dataset` if it has `__len__` and `__getitem__`; else a ValueError: `problem`, its type."""
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ValueError(f"{problem}, got {type(dataset).__name__}")
    return dataset  # type: ignore[no-any-return]


ForeignAdopter = Callable[[object], "Dataset[Any] | None"]
"""Given any object: the dataset loadax reads it as, or None when it is not its kind."""

_FOREIGN_ADOPTERS: list[ForeignAdopter] = []


def adopts_foreign_datasets(adopter: ForeignAdopter) -> ForeignAdopter:
    """Register `adopter` (a decorator): a source for another library's datasets registers one, so
    that `as_dataset` reads those datasets through it when they are given as-is."""
    _FOREIGN_ADOPTERS.append(adopter)
    return adopter


def as_dataset(
    dataset: Any, problem: str = "dataset must have __len__ and __getitem__"
) -> Dataset[Any]:
    """`dataset` as loadax reads it: another library's dataset through the source registered for
    it (a Hugging Face `datasets.Dataset` as `HuggingFaceDataset(dataset)`, numpy format: a list
    column is one array per record, of its feature's dtype); anything else checked like
    `require_dataset`.

    >>> from loadax.dataset.protocol import as_dataset
    >>> as_dataset([1, 2])
    [1, 2]
    """
    for adopter in _FOREIGN_ADOPTERS:
        if (adopted := adopter(dataset)) is not None:
            return adopted
    return require_dataset(dataset, problem)


def as_datasets(datasets: Iterable[Any]) -> tuple[Dataset[Any], ...]:
    """`as_dataset` of each of `datasets`; an error names the position."""
    return tuple(_each(as_dataset, datasets))


def dataset_length(dataset: Dataset[Any]) -> int:
    """`len(dataset)`, checked to be a non-negative int."""
    require_dataset(dataset)
    return require_int(f"len({type(dataset).__name__})", len(dataset), minimum=0)


def dataset_lengths(datasets: Sequence[Dataset[Any]]) -> list[int]:
    """The length of each of a non-empty sequence of datasets; errors name the position."""
    if not datasets:
        raise ValueError("datasets must not be empty")
    return _each(dataset_length, datasets)


def _each(check: Callable[[Any], R], datasets: Iterable[Any]) -> list[R]:
    """`check` of each of `datasets`; its ValueError is raised again naming the position."""
    checked = []
    for position, dataset in enumerate(datasets):
        try:
            checked.append(check(dataset))
        except ValueError as error:
            raise ValueError(f"datasets[{position}]: {error}") from None
    return checked
