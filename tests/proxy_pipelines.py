"""A pipeline factory for worker configs in tests of what lies between client and worker:
`factory = "proxy_pipelines:slow_after"`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import loadax
from loadax.identity.fingerprint import PROBE_ROWS


def slow_after(records: int = 8, delay: float = 1.0) -> loadax.Pipeline[Any, Any]:
    """Record i is {"x": i (int64)}; each past the first `PROBE_ROWS` (those the worker reads at
    start-up, to probe the pipeline) takes `delay` seconds more to read, as from a remote store."""

    def record(index: int) -> dict[str, Any]:
        if index >= PROBE_ROWS:
            time.sleep(delay)  # the wait a remote read has, not synchronisation
        return {"x": np.int64(index)}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(record), loadax.Batcher())
