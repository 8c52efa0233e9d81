"""Pipeline parts for process workers: module-level functions, so that they pickle by name."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
from stream_pipelines import sequence


def record(index: int) -> dict[str, Any]:
    """Record i: {"x": [i, i, i] (int64), "y": 2 i (int32), "name": "r<i>"}."""
    return {"x": np.full(3, index, dtype=np.int64), "y": np.int32(2 * index), "name": f"r{index}"}


def megabyte(index: int) -> np.ndarray[Any, Any]:
    """Record i: a MiB of bytes, each i % 251."""
    return np.full(1 << 20, index % 251, dtype=np.uint8)


def noisy(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """`record` with "noise": float32 numbers from its own rng (keyed by seed, epoch, index)."""
    return {**record, "noise": rng.random(4, dtype=np.float32)}


def spectrum(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A GIL-holding FFT, cut to a quarter: the W3 benchmark's transform."""
    side = x.shape[-1] // 2
    result: np.ndarray[Any, Any] = np.abs(np.fft.fft2(x)).astype(np.float32)[:side, :side]
    return result


def not_a_multiple_of_3(record: dict[str, Any]) -> bool:
    return bool(record["x"][0] % 3)


def nonempty(record: dict[str, Any]) -> bool:
    return bool(record["inputs"].size > 0)


def tokens(index: int) -> dict[str, Any]:
    return sequence(index)


def failing_record(index: int) -> dict[str, Any]:
    """Like `record`, but record 7 raises."""
    if index == 7:
        raise ValueError(f"record {index} is corrupt")
    return record(index)


def total(records: list[dict[str, Any]]) -> int:
    """A batcher that gives a plain int, and refuses batches holding record 7."""
    values = [int(item["y"]) for item in records]
    if 14 in values:
        raise KeyError("no total for the batch of record 7")
    return sum(values)


class StubbornError(Exception):
    """An error that pickles but cannot be unpickled (its __init__ wants two arguments)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} ({code})")


def stubborn(index: int) -> int:
    if index == 3:
        raise StubbornError("record 3 is stubborn", 3)
    return index


def a_set(records: list[Any]) -> set[int]:
    """A batcher whose batches loadax.wire.codec cannot send."""
    return {int(item["y"]) for item in records}


@dataclasses.dataclass(frozen=True)
class KillOnce:
    """`record`, except that reading record `index` kills the reading process the first time:
    while `marker` exists, which it deletes."""

    marker: Path
    index: int

    def __call__(self, index: int) -> dict[str, Any]:
        if index == self.index and self.marker.exists():
            self.marker.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return record(index)


def _refuse() -> None:
    raise RuntimeError("this pipeline refuses to be unpickled here")


class Unloadable:
    """A map function that pickles, but whose unpickling (in a worker process) raises."""

    def __call__(self, index: int) -> int:
        return index

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())
