"""Pipelines whose functions are partials, callable objects and closures, for identity tests.

Their objects have the default `repr`, with a memory address in it: an identity that read it
would differ between two processes running this same code.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import loadax
from loadax.dataset.stream import Stream

LIMIT = 50
"""Records from this index on are zeroed by `clipped_at_limit`: past what a probe reads."""
WORDS = {"alpha", "beta", "gamma", "delta", "epsilon"}


def clip(value: int, limit: int) -> int:
    return value if value < limit else 0


def clipped_at_limit(value: int) -> int:
    return clip(value, LIMIT)


class Clip:
    """`clip` as a callable object."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __call__(self, value: int) -> int:
        return clip(value, self.limit)


class Scale:
    """Record i is {"x": factor * i}; a word table rides along, its order the hash seed's."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.lengths = {word: len(word) for word in WORDS}  # insertion order: the set's

    def __call__(self, value: int) -> dict[str, Any]:
        return {"x": np.int64(value * self.factor)}


class Divisible:
    """A filter: keeps the records whose "x" is divisible by `by`."""

    def __init__(self, by: int) -> None:
        self.by = by
        self.me = self  # a cycle

    def __call__(self, record: dict[str, Any]) -> bool:
        return int(record["x"]) % self.by == 0


def total(records: list[dict[str, Any]], offset: int, words: frozenset[str]) -> np.int64:
    return np.int64(sum(int(record["x"]) for record in records) + offset + len(words))


def scaled(value: int, factor: int) -> dict[str, Any]:
    return {"x": np.int64(value * factor)}


def partials(records: int = 40, factor: int = 3) -> loadax.Pipeline[Any, Any]:
    """Random access: a callable object maps, a partial batches."""
    batcher = functools.partial(total, offset=1, words=frozenset(WORDS))
    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(Scale(factor)), loadax.Batcher(batcher)
    )


def stream_of_partials(records: int = 60, window: int = 8) -> loadax.Pipeline[Any, Any]:
    """A stream: a partial maps, a callable object filters."""
    stream = Stream(loadax.RangeDataset(0, records), window=window)
    stream = stream.map(functools.partial(scaled, factor=2)).filter(Divisible(3))
    return loadax.Pipeline(stream, loadax.Batcher())
