"""Stream pipeline factories (filter, pack) that tests and worker configs name."""

from __future__ import annotations

from typing import Any

import numpy as np

import loadax
from loadax.dataset.stream import Stream


def sequence(index: int) -> dict[str, Any]:
    """Record i: a token sequence of 0 to 12 tokens, each 1000 i + its position."""
    length = int(np.random.default_rng(index).integers(0, 13))
    return {"inputs": 1000 * index + np.arange(length, dtype=np.int32)}


def odd_numbers(records: int = 200, window: int = 16) -> loadax.Pipeline[Any, Any]:
    """The odd records of `numbers`-like data: record i is {"x": [i, i], "y": 2 i}."""
    dataset = loadax.RangeDataset(0, records).map(
        lambda i: {"x": np.full(2, i, dtype=np.int64), "y": np.int32(2 * i)}
    )
    return loadax.Pipeline(
        Stream(dataset, window=window).filter(lambda record: bool(record["y"] % 4 == 2)),
        loadax.Batcher(),
    )


def packed_sequences(
    records: int = 300, window: int = 32, length: int = 16
) -> loadax.Pipeline[Any, Any]:
    """Sequences of `sequence`, the empty ones filtered out, packed into rows of `length`."""
    dataset = loadax.RangeDataset(0, records).map(sequence)
    stream = (
        Stream(dataset, window=window).filter(lambda record: record["inputs"].size > 0).pack(length)
    )
    return loadax.Pipeline(stream, loadax.Batcher())
