"""loadax's pipelines of the workloads: built in the client for local runs, and by
`loadax-worker` (as config factories, `bench_pipelines:w2`) for remote ones."""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from fleet import SLOWDOWN_ENV
from workloads import SEED, Workload, spectrum, t1_payload, w2_example

import loadax


def pipeline(spec: Workload) -> loadax.Pipeline[Any, Any]:
    """The pipeline of W1, W2 (and R1) or W3 at the size of `spec`."""
    if spec.name == "W1":
        return loadax.Pipeline(loadax.RangeDataset(0, spec.records), loadax.Batcher())
    if spec.name in ("W2", "R1"):
        return w2(str(spec.data_file()))
    if spec.name == "W3":
        return w3(str(spec.data_file()))
    raise ValueError(f"no loadax pipeline for workload {spec.name}")


def w2(path: str) -> loadax.Pipeline[Any, Any]:
    """W2: the records of the W2 file at `path`, randomly cropped, flipped and normalised."""
    dataset = loadax.NumpyDataset(path).random_map(w2_example, seed=SEED)
    return loadax.Pipeline(dataset, loadax.Batcher())


def w3(path: str) -> loadax.Pipeline[Any, Any]:
    """W3: the arrays of the W3 file at `path`, each abs(fft2) cut to 256x256 (CPU-heavy)."""
    return loadax.Pipeline(loadax.NumpyDataset(path).map(spectrum), loadax.Batcher())


def first_record(records: list[npt.NDArray[np.uint8]]) -> npt.NDArray[np.uint8]:
    """T1's batcher: a batch is its one pre-built record, as is (no collation cost)."""
    return records[0]


def t1(batches: int, batch_bytes: int) -> loadax.Pipeline[Any, Any]:
    """T1: `batches` records that are all the same pre-built buffer of `batch_bytes`."""
    payload = t1_payload(batch_bytes)
    return loadax.Pipeline(
        loadax.InMemoryDataset([payload] * batches), loadax.Batcher(first_record)
    )


R2_RECORD_BYTES = 1024


def r2_record(cost_s: float, index: int) -> npt.NDArray[np.uint8]:
    """R2's record `index`: 1 KiB made from the index, after a GIL-releasing sleep of `cost_s`
    (times the worker's slowdown)."""
    # Read here, not in the factory nor at import: the slowdown changes only the timing, never
    # the pipeline's identity (args, code and the values it uses), so a straggler started with
    # it serves the same pipeline as its healthy peers.
    slowdown = float(os.environ.get(SLOWDOWN_ENV, "1"))
    time.sleep(cost_s * slowdown)
    return (np.arange(R2_RECORD_BYTES, dtype=np.int64) + index).astype(np.uint8)


def r2(records: int, cost_ms: int) -> loadax.Pipeline[Any, Any]:
    """R2: `records` records of 1 KiB, each costing a sleep of `cost_ms` milliseconds."""
    dataset = loadax.RangeDataset(0, records).map(functools.partial(r2_record, cost_ms / 1000))
    return loadax.Pipeline(dataset, loadax.Batcher())


def gil_record(loops: int, index: int) -> npt.NDArray[np.int64]:
    """Record `index` of the GIL-bound pipeline: `loops` steps of pure-Python arithmetic, which
    holds the GIL throughout (as a Python decoder or tokenizer does), summed into 8 numbers."""
    total = index
    for step in range(loops):
        total = (total * 31 + step) % 1_000_003
    return np.full(8, total, dtype=np.int64)


def gil_bound(records: int, loops: int) -> loadax.Pipeline[Any, Any]:
    """`records` records, each `loops` steps of pure-Python work (see `gil_record`)."""
    dataset = loadax.RangeDataset(0, records).map(functools.partial(gil_record, loops))
    return loadax.Pipeline(dataset, loadax.Batcher())
