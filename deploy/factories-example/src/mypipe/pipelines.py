"""Pipeline factories: each returns the `loadax.Pipeline` a `[pipelines.NAME]` table names."""

from __future__ import annotations

from typing import Any

import numpy as np

import loadax


def square(index: int) -> dict[str, Any]:
    return {"index": np.int64(index), "square": np.float32(index) ** 2}


def squares(records: int = 1024) -> loadax.Pipeline[Any, Any]:
    """The squares of 0 .. records - 1, one a record."""
    return loadax.Pipeline(loadax.RangeDataset(0, records).map(square), loadax.Batcher())
