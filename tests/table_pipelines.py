"""Pipeline factories over table sources; each writes its data files in `directory`."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

import loadax
from loadax.sources.parquet import ParquetDataset
from loadax.sources.polars import PolarsDataset

FILES, ROW_GROUP = 3, 4


def columns(records: int) -> dict[str, np.ndarray[Any, Any]]:
    """Row i: x = i / 2 (float32), label = i % 7 (int64), vec = [i, i + 1, i + 2] (float32)."""
    index = np.arange(records)
    return {
        "x": (index / 2).astype(np.float32),
        "label": (index % 7).astype(np.int64),
        "vec": (index[:, None] + np.arange(3)).astype(np.float32),
    }


def expected_records(records: int) -> list[dict[str, Any]]:
    """The records both sources give, as numpy scalars and arrays."""
    data = columns(records)
    return [{name: values[i] for name, values in data.items()} for i in range(records)]


def arrow_table(records: int) -> pa.Table:
    data = columns(records)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(data["vec"].reshape(-1)), 3)
    return pa.table({"x": data["x"], "label": data["label"], "vec": vec})


def write_parquet_rows(directory: str | os.PathLike[str], records: int = 40) -> list[Path]:
    """`rows-0.parquet` ...: the rows split over 3 files, in row groups of 4 rows."""
    table = arrow_table(records)
    bounds = np.linspace(0, records, FILES + 1).astype(int).tolist()
    paths = []
    for number, (start, stop) in enumerate(itertools.pairwise(bounds)):
        path = Path(directory) / f"rows-{number}.parquet"
        if not path.exists():
            partial = path.with_name(f"rows-{number}.{os.getpid()}.parquet")
            pq.write_table(table.slice(start, stop - start), partial, row_group_size=ROW_GROUP)
            os.replace(partial, path)  # a worker and a test may both write it: all or nothing
        paths.append(path)
    return paths


def write_polars_rows(directory: str | os.PathLike[str], records: int = 40) -> Path:
    """`frame.parquet`: the rows in one file, written by polars."""
    path = Path(directory) / "frame.parquet"
    if not path.exists():
        partial = path.with_name(f"frame.{os.getpid()}.parquet")
        frame = pl.from_arrow(arrow_table(records))
        assert isinstance(frame, pl.DataFrame)
        frame.write_parquet(partial)
        os.replace(partial, path)
    return path


def parquet_rows(directory: str, records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Record i is row i across the three files: {"x", "label", "vec"}."""
    return loadax.Pipeline(ParquetDataset(write_parquet_rows(directory, records)), loadax.Batcher())


def polars_rows(directory: str, records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Record i is row i of a lazily scanned `frame.parquet`, collected once."""
    frame = pl.scan_parquet(write_polars_rows(directory, records))
    return loadax.Pipeline(PolarsDataset(frame), loadax.Batcher())
