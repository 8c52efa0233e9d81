"""Pipeline factories whose batches fail on the worker, for worker configs in tests: e.g.
`factory = "failure_pipelines:ragged"`."""

from __future__ import annotations

from typing import Any

import numpy as np

import loadax


def _tokens(index: int) -> dict[str, Any]:
    return {"tokens": np.full(index % 3 + 1, index, dtype=np.int32)}


def ragged(records: int = 64) -> loadax.Pipeline[Any, Any]:
    """Record i is {"tokens": i % 3 + 1 int32 values}: rows of different lengths, which the
    default `Batcher` cannot stack (a batch of one row can)."""
    return loadax.Pipeline(loadax.RangeDataset(0, records).map(_tokens), loadax.Batcher())


class ShapeError(Exception):
    """An error of the user's own, which no client can import."""

    def __init__(self, step: int, detail: str) -> None:
        super().__init__(f"{detail} (step {step})")


def _refuse(batch: list[Any]) -> Any:
    raise ShapeError(len(batch), "this batcher refuses every batch")


def refusing(records: int = 64) -> loadax.Pipeline[Any, Any]:
    """Every batch's collation raises `ShapeError`, which cannot be pickled back."""
    return loadax.Pipeline(loadax.RangeDataset(0, records), loadax.Batcher(_refuse))


class Row:
    """Record i as `floats` float32 values (each row `4 * floats` bytes); counts its calls."""

    def __init__(self, floats: int) -> None:
        self.floats = floats
        self.calls = 0

    def __call__(self, index: int) -> Any:
        self.calls += 1
        return np.full(self.floats, index, dtype=np.float32)


def by_largest(records: list[int]) -> Any:
    """Rows as wide as 256 floats per unit of the largest record in the batch: a batch's size
    is not its rows times a row's size."""
    return np.zeros((len(records), 256 * (max(records) + 1)), dtype=np.float32)


def growing(records: int = 64) -> loadax.Pipeline[Any, Any]:
    """Batches of `by_largest`: the batch of step s is about 16 s KiB a row."""
    return loadax.Pipeline(loadax.RangeDataset(0, records), loadax.Batcher(by_largest))


def _exhaust(batch: list[Any]) -> Any:
    raise MemoryError(f"cannot allocate a batch of {len(batch)} rows")


def exhausting(records: int = 64) -> loadax.Pipeline[Any, Any]:
    """Every batch's collation raises MemoryError: the worker's failure, not the pipeline's, so
    a client asks again (elsewhere, or later)."""
    return loadax.Pipeline(loadax.RangeDataset(0, records), loadax.Batcher(_exhaust))


def _unreachable(batch: list[Any]) -> Any:
    raise loadax.StorageError(
        "cannot reach 's3://bucket/key'", "s3://bucket/key", "curlCode: 7", transient=True
    )


def unreachable(records: int = 64) -> loadax.Pipeline[Any, Any]:
    """Every batch fails as a store that cannot be reached does: the worker's failure (the store
    may be back, or reachable from another worker), not the pipeline's."""
    return loadax.Pipeline(loadax.RangeDataset(0, records), loadax.Batcher(_unreachable))


def _missing(batch: list[Any]) -> Any:
    raise loadax.StorageError("no object 's3://bucket/key'", "s3://bucket/key", "NoSuchKey")


def missing(records: int = 64) -> loadax.Pipeline[Any, Any]:
    """Every batch fails as a store that refuses (no such object) does: every worker with the
    job's store settings would, so it is raised, as a StorageError, not asked again."""
    return loadax.Pipeline(loadax.RangeDataset(0, records), loadax.Batcher(_missing))
