"""A polars DataFrame as a dataset: record i is row i, a column -> value dict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
from polars.datatypes import DataTypeClass

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.columns import check_columns, choose_columns


class PolarsDataset(DatasetBase[dict[str, Any]]):
    """The rows of `frame`, a `polars.DataFrame`, or a `polars.LazyFrame` collected once here.

    `columns` picks the columns of each record (default: all). Numeric and boolean values without
    nulls are numpy scalars of the column's dtype, fixed-width `Array` values of them are numpy
    arrays, and everything else is the Python value `to_list` gives. Each batch is one gather of
    the selected columns. The frame is held, not copied; polars frames are immutable, so reading
    threads share it.

    >>> import polars as pl
    >>> from loadax.sources.polars import PolarsDataset
    >>> frame = pl.DataFrame({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    >>> dataset = PolarsDataset(frame, columns=["name"])
    >>> len(dataset), dataset.columns, dataset[0]
    (3, ('name',), {'name': 'a'})
    """

    def __init__(
        self, frame: pl.DataFrame | pl.LazyFrame, columns: Sequence[str] | None = None
    ) -> None:
        if isinstance(frame, pl.LazyFrame):
            frame = frame.collect()
        if not isinstance(frame, pl.DataFrame):
            raise ValueError(
                "PolarsDataset: frame must be a polars.DataFrame or polars.LazyFrame, "
                f"got {type(frame).__name__}"
            )
        check_columns(columns, "PolarsDataset")
        chosen = choose_columns(columns, frame.columns, source="PolarsDataset", table="the frame")
        if not chosen:
            raise ValueError("PolarsDataset: columns must name at least one column")
        self._columns = chosen
        self._frame = frame.select(chosen)

    def __len__(self) -> int:
        return self._frame.height

    @property
    def columns(self) -> tuple[str, ...]:
        """The keys of every record, in order."""
        return self._columns

    @property
    def frame(self) -> pl.DataFrame:
        """The selected columns of the frame."""
        return self._frame

    def read(self, indices: IndexArray, epoch: int) -> list[dict[str, Any]]:
        if indices.size == 0:
            return []
        taken = self._frame[indices]
        columns = [_values(taken.get_column(name)) for name in self._columns]
        return [dict(zip(self._columns, row, strict=True)) for row in zip(*columns, strict=True)]

    def __repr__(self) -> str:
        return f"PolarsDataset(<{self._frame.height} rows>, columns={list(self._columns)!r})"


def _is_plain(kind: pl.DataType | DataTypeClass) -> bool:
    return kind.is_integer() or kind.is_float() or kind == pl.Boolean


def _values(series: pl.Series) -> list[Any]:
    """The values of `series`, typed by the column alone, never by the batch."""
    kind = series.dtype
    if _is_plain(kind):
        if series.null_count() == 0:
            return list(series.to_numpy())
        present = iter(series.drop_nulls().to_numpy())
        return [next(present) if valid else None for valid in series.is_not_null().to_list()]
    if isinstance(kind, pl.Array) and _is_plain(kind.inner) and len(kind.shape) == 1:
        if series.null_count() == 0 and series.arr.explode().null_count() == 0:
            return list(series.to_numpy())
        dtype = pl.Series([], dtype=kind.inner).to_numpy().dtype
        return [
            row if row is None or None in row else np.array(row, dtype=dtype)
            for row in series.to_list()
        ]
    return series.to_list()
