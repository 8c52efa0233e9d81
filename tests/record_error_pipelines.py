"""Pipelines whose records fail by index, for the bad-record policies: module-level, so that
they pickle by name for loader processes and a worker's config can name them."""

from __future__ import annotations

from typing import Any

import numpy as np

import loadax
from loadax.errors import StorageError

BAD = frozenset({5, 6, 13, 38, 39})
"""The records that fail: 38 and 39 end the unshuffled epoch, so a replacement wraps."""


def good(index: int) -> dict[str, Any]:
    return {"x": np.full(2, index, dtype=np.int64), "y": np.float32(index)}


def decoded(index: int) -> dict[str, Any]:
    if index in BAD:
        raise ValueError(f"record {index} is corrupt")
    return good(index)


def unreachable(index: int) -> dict[str, Any]:
    if index == 9:
        raise StorageError("cannot reach 's3://b/9'", "s3://b/9", "timed out", transient=True)
    return good(index)


def flaky(records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Records 0..records-1 as `good`, those of `BAD` failing with a ValueError."""
    return loadax.Pipeline(loadax.RangeDataset(0, records).map(decoded), loadax.Batcher())
