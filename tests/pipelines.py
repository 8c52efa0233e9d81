"""Pipeline factories that test worker configs name, e.g. `factory = "pipelines:images"`."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import numpy as np

import loadax

log = logging.getLogger("pipelines")

SERVED = """
[pipelines.numbers]
factory = "pipelines:numbers"
args = { records = 30 }

[pipelines.images]
factory = "pipelines:images"
args = { records = 40, side = 8 }
"""
"""The `[pipelines]` tables of a worker config serving `numbers` and `images`."""


def numbers(records: int = 100) -> loadax.Pipeline[Any, Any]:
    """Record i is {"x": [i, i, i] (int64), "y": 2 i (int32)}."""
    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(
            lambda i: {"x": np.full(3, i, dtype=np.int64), "y": np.int32(2 * i)}
        ),
        loadax.Batcher(),
    )


def images(records: int = 64, side: int = 16) -> loadax.Pipeline[Any, Any]:
    """Random uint8 images (record i from seed i), randomly cropped to `side` and flipped."""
    margin = max(1, side // 4)

    def image(index: int) -> dict[str, Any]:
        rng = np.random.default_rng(index)
        pixels = rng.integers(0, 256, size=(side + margin, side + margin, 3), dtype=np.uint8)
        return {"image": pixels, "label": np.int32(index % 10)}

    def crop_and_flip(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        top, left = rng.integers(0, margin + 1, size=2)
        crop = record["image"][top : top + side, left : left + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        return {"image": crop.astype(np.float32) / 255.0, "label": record["label"]}

    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(image).random_map(crop_and_flip), loadax.Batcher()
    )


def failing(records: int = 20, bad: int = 7) -> loadax.Pipeline[Any, Any]:
    """Like `numbers`, but reading record `bad` raises."""

    def record(index: int) -> dict[str, Any]:
        if index == bad:
            raise ValueError(f"record {index} is corrupt")
        return {"x": np.int64(index)}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(record), loadax.Batcher())


def slow(records: int = 32, delay: float = 0.2) -> loadax.Pipeline[Any, Any]:
    """Each record takes `delay` seconds, and logs "reading record i" when it starts."""

    def record(index: int) -> dict[str, Any]:
        log.warning("reading record %d", index)
        time.sleep(delay)  # the work a slow source does, not synchronisation
        return {"x": np.int64(index)}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(record), loadax.Batcher())


def paced(records: int = 128, delay: float = 0.01) -> loadax.Pipeline[Any, Any]:
    """Record i is {"x": i}, each taking `delay` seconds times the worker's
    LOADAX_TEST_SLOWDOWN (default 1): a slow machine, not another pipeline (the variable is
    read as records are made, so the pipeline's identity does not depend on it)."""

    def record(index: int) -> dict[str, Any]:
        time.sleep(delay * float(os.environ.get("LOADAX_TEST_SLOWDOWN", "1")))  # the work
        return {"x": np.int64(index)}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(record), loadax.Batcher())


def not_a_pipeline() -> int:
    return 42


def exploding() -> loadax.Pipeline[Any, Any]:
    raise RuntimeError("the factory exploded")


def blobs(records: int = 256, floats: int = 16384, delay: float = 0.0) -> loadax.Pipeline[Any, Any]:
    """Record i is {"x": `floats` float32 numbers drawn from seed i, "label": i (int32)}; each
    takes `delay` seconds more to read, as from a remote store."""

    def record(index: int) -> dict[str, Any]:
        if delay:
            time.sleep(delay)  # the wait a remote read has, not synchronisation
        x = np.random.default_rng(index).random(floats, dtype=np.float32)
        return {"x": x, "label": np.int32(index)}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(record), loadax.Batcher())


def poisoned(
    records: int = 40, kill: int = -1, hang: int = -1, raises: int = -1
) -> loadax.Pipeline[Any, Any]:
    """Record i is {"x": i}, except that reading record `kill` ends its process (exit code 3),
    record `hang` never finishes, and record `raises` raises a ValueError."""

    def record(index: int) -> dict[str, Any]:
        if index == kill:
            os._exit(3)
        if index == hang:
            threading.Event().wait()  # forever: nothing sets it
        if index == raises:
            raise ValueError(f"record {index} is corrupt")
        return {"x": np.int64(index)}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(record), loadax.Batcher())
