"""Pipeline factories over file sources; each writes its data file in `directory`."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

import loadax
from loadax.sources.numpy import NumpyDataset
from loadax.sources.sqlite import SQLiteDataset


def write_numpy_rows(directory: str | os.PathLike[str], records: int = 40) -> Path:
    """`rows.npy`: `records` rows of 6 float32 numbers drawn from seed 0."""
    path = Path(directory) / "rows.npy"
    if not path.exists():
        rows = np.random.default_rng(0).random((records, 6), dtype=np.float32)
        partial = path.with_name(f"rows.{os.getpid()}.npy")
        np.save(partial, rows)
        os.replace(partial, path)  # a worker and a test may both write it: all or nothing
    return path


def write_sqlite_rows(directory: str | os.PathLike[str], records: int = 40) -> Path:
    """`rows.db`, table `samples`: row i has rowid 3 i + 1 (gaps), x = i / 2, label = i % 7."""
    path = Path(directory) / "rows.db"
    if not path.exists():
        partial = path.with_name(f"rows.{os.getpid()}.db")
        partial.unlink(missing_ok=True)
        with sqlite3.connect(partial) as connection:
            connection.execute("CREATE TABLE samples (x REAL, label INTEGER)")
            connection.executemany(
                "INSERT INTO samples (rowid, x, label) VALUES (?, ?, ?)",
                [(3 * i + 1, i * 0.5, i % 7) for i in range(records)],
            )
        connection.close()
        os.replace(partial, path)
    return path


def numpy_rows(directory: str, records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Record i is {"x": row i of `rows.npy`}."""
    dataset = NumpyDataset(write_numpy_rows(directory, records)).map(lambda row: {"x": row})
    return loadax.Pipeline(dataset, loadax.Batcher())


def sqlite_rows(directory: str, records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Record i is row i of table `samples` of `rows.db`: {"x": float, "label": int}."""
    return loadax.Pipeline(
        SQLiteDataset(write_sqlite_rows(directory, records), table="samples"), loadax.Batcher()
    )
