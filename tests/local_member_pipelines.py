"""Pipelines for local members and sizing tests: module-level parts, so that a child process
(`local_members(kind="processes")`) unpickles them by name and a worker config can name them."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from process_pipelines import noisy, record

import loadax


def noisy_records(records: int = 48) -> loadax.Pipeline[Any, Any]:
    """`process_pipelines.record` with per-record random noise: any placement must agree."""
    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(record).random_map(noisy), loadax.Batcher()
    )


def slept(cost_s: float, index: int) -> np.ndarray[Any, Any]:
    """Record `index` (8 int64s) after a GIL-releasing sleep of `cost_s`."""
    time.sleep(cost_s)
    return np.full(8, index, dtype=np.int64)


def sleepy(records: int = 10_000, cost_ms: float = 10.0) -> loadax.Pipeline[Any, Any]:
    """Records that each cost a sleep of `cost_ms`: a worker's rate is known in advance."""
    import functools

    dataset = loadax.RangeDataset(0, records).map(functools.partial(slept, cost_ms / 1000))
    return loadax.Pipeline(dataset, loadax.Batcher())
