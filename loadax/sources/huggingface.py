"""A Hugging Face `datasets.Dataset` as a dataset: record i is row i, a column -> value dict."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from loadax.dataset.ops import DatasetBase
from loadax.dataset.protocol import adopts_foreign_datasets
from loadax.plan.permutation import IndexArray
from loadax.sources.columns import check_columns, choose_columns

if TYPE_CHECKING:
    import datasets

_FORMATS = ("python", "numpy")
_TABLE_FORMATS = ("arrow", "pandas", "polars")  # these give a table per read, not rows


class HuggingFaceDataset(DatasetBase[dict[str, Any]]):
    """The rows of a `datasets.Dataset` (one split, not a `DatasetDict`), as column -> value dicts.

    `columns` picks the columns of each record (default: all), so the others are never decoded.
    `format` is "numpy" (the default: numpy arrays and scalars of each feature's dtype, so that a
    list column stacks into one array per batch), "python" (lists, ints, str: a list column
    stacks into one array per position) or None (the dataset's own format, e.g. "torch"). Each
    batch is one batched `__getitems__` read of the Arrow table. A `datasets.Dataset` given to a
    loader or a dataset op as-is is read as `HuggingFaceDataset(dataset)`.

    >>> import datasets
    >>> from loadax.sources.huggingface import HuggingFaceDataset
    >>> table = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
    >>> HuggingFaceDataset(table, format="python")[1]
    {'text': 'b', 'label': 1}
    >>> HuggingFaceDataset(table, columns=["label"])[1]["label"].dtype
    dtype('int64')
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        columns: Sequence[str] | None = None,
        format: str | None = "numpy",
    ) -> None:
        _check_dataset(dataset)
        check_columns(columns, "HuggingFaceDataset")
        if format is not None and format not in _FORMATS:
            raise ValueError(
                f"HuggingFaceDataset: format must be None or one of {list(_FORMATS)}, "
                f"got {format!r}"
            )
        names = [str(name) for name in cast(list[str], dataset.column_names)]
        self._columns = choose_columns(
            columns, names, source="HuggingFaceDataset", table="the dataset"
        )
        if not self._columns:
            raise ValueError("HuggingFaceDataset: the dataset has no columns")
        if format is None:
            format = cast(dict[str, Any], dataset.format)["type"]
            if format in _TABLE_FORMATS:
                raise ValueError(
                    f"HuggingFaceDataset: the dataset has format {format!r}, which reads tables, "
                    f"not rows; pass format='python' or format='numpy'"
                )
        if list(self._columns) != names:
            dataset = dataset.select_columns(list(self._columns))
        if format is not None:
            dataset = dataset.with_format(format)
        self._dataset = dataset
        self._format: str | None = format
        self._length = len(dataset)

    @classmethod
    def load_from_disk(
        cls,
        path: str | os.PathLike[str],
        split: str | None = None,
        columns: Sequence[str] | None = None,
        format: str | None = "numpy",
        keep_in_memory: bool = False,
    ) -> HuggingFaceDataset:
        """The dataset that `save_to_disk` wrote at `path` (memory-mapped unless `keep_in_memory`);
        `split` picks a split of a saved `DatasetDict`."""
        where = Path(path)
        if not where.is_dir():
            raise FileNotFoundError(f"HuggingFaceDataset: no saved dataset at {str(where)!r}")
        try:
            loaded = _datasets().load_from_disk(str(where), keep_in_memory=keep_in_memory)
        except FileNotFoundError as error:
            raise ValueError(
                f"HuggingFaceDataset: {str(where)!r} is not a dataset saved by save_to_disk: "
                f"{error}"
            ) from None
        return cls(_pick_split(loaded, split, repr(str(where))), columns, format)

    @classmethod
    def from_hub(
        cls,
        name: str,
        split: str,
        config: str | None = None,
        revision: str | None = None,
        columns: Sequence[str] | None = None,
        format: str | None = "numpy",
        **options: Any,
    ) -> HuggingFaceDataset:
        """`split` of Hub dataset `name` via `datasets.load_dataset` (needs the network the first
        time; then the local cache); `options` go to `load_dataset`."""
        loaded = _datasets().load_dataset(name, config, split=split, revision=revision, **options)
        return cls(_pick_split(loaded, None, repr(name)), columns, format)

    def __len__(self) -> int:
        return self._length

    @property
    def columns(self) -> tuple[str, ...]:
        """The keys of every record, in order."""
        return self._columns

    @property
    def dataset(self) -> datasets.Dataset:
        """The wrapped `datasets.Dataset`, with the chosen columns and format."""
        return self._dataset

    def read(self, indices: IndexArray, epoch: int) -> list[dict[str, Any]]:
        if indices.size == 0:
            return []
        rows = cast(list[dict[str, Any]], self._dataset.__getitems__(indices.tolist()))
        # select_columns may keep the table's column order; records follow `columns`.
        return [{column: row[column] for column in self._columns} for row in rows]

    def __repr__(self) -> str:
        return (
            f"HuggingFaceDataset(<{self._length} rows>, columns={list(self._columns)!r}, "
            f"format={self._format!r})"
        )


def _datasets() -> Any:
    """The `datasets` package, or an ImportError that says how to install it."""
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            "HuggingFaceDataset reads Hugging Face datasets, and `datasets` is not installed: "
            "pip install 'loadax[huggingface]'"
        ) from error
    return datasets


@adopts_foreign_datasets
def _adopt(dataset: object) -> HuggingFaceDataset | None:
    """A Hugging Face dataset given as-is, read as `HuggingFaceDataset(dataset)` (which refuses a
    `DatasetDict` or a streaming dataset, naming it); None for anything else."""
    hf = sys.modules.get("datasets")  # such a dataset exists only once `datasets` is imported
    if hf is None or not isinstance(
        dataset, hf.Dataset | hf.DatasetDict | hf.IterableDataset | hf.IterableDatasetDict
    ):
        return None
    return HuggingFaceDataset(dataset)


def _check_dataset(dataset: object) -> None:
    hf = _datasets()
    if isinstance(dataset, hf.Dataset):
        return
    if isinstance(dataset, hf.DatasetDict):
        splits = list(dataset)
        raise ValueError(
            f"HuggingFaceDataset: got a DatasetDict with splits {splits}; pick one, e.g. "
            f"dataset[{splits[0]!r}] (or split={splits[0]!r} to load_from_disk)"
            if splits
            else "HuggingFaceDataset: got an empty DatasetDict; pick a split of a datasets.Dataset"
        )
    if isinstance(dataset, hf.IterableDataset | hf.IterableDatasetDict):
        raise ValueError(
            f"HuggingFaceDataset: got a {type(dataset).__name__}, which has no random access; "
            "load it without streaming=True"
        )
    raise ValueError(
        f"HuggingFaceDataset: dataset must be a datasets.Dataset, got {type(dataset).__name__}"
    )


def _pick_split(loaded: object, split: str | None, where: str) -> datasets.Dataset:
    hf = _datasets()
    if split is None or not isinstance(loaded, hf.DatasetDict):
        if split is not None:
            raise ValueError(f"HuggingFaceDataset: {where} holds one split, not {split!r}")
        _check_dataset(loaded)
        return cast("datasets.Dataset", loaded)
    if split not in loaded:
        raise ValueError(
            f"HuggingFaceDataset: {where} has no split {split!r}; its splits are {list(loaded)}"
        )
    return cast("datasets.Dataset", loaded[split])
