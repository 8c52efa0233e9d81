"""The examples' synthetic pipelines, as worker factories.

`images` (randomly cropped and flipped) for the demo; `regression` (a noisy linear target) for
the training examples.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

import loadax

NUM_CLASSES = 10
AUGMENT_SEED = 7
FEATURES = 8
NOISE = 0.01
TRUE_W_SEED = 1234


class Record(TypedDict):
    image: npt.NDArray[Any]
    label: int


def images(records: int = 2048, side: int = 64, crop: int = 56) -> loadax.Pipeline[Any, Any]:
    """`records` uint8 (side, side, 3) images, cropped to (crop, crop), flipped, as float32."""

    def make_record(index: int) -> Record:
        rng = np.random.default_rng(index)  # the same bytes every time record `index` is read
        image = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        return {"image": image, "label": int(rng.integers(NUM_CLASSES))}

    def augment(record: Record, rng: np.random.Generator) -> Record:
        top, left = rng.integers(0, side - crop + 1, size=2)
        image = record["image"][top : top + crop, left : left + crop]
        if rng.random() < 0.5:
            image = image[:, ::-1]
        return {"image": image, "label": record["label"]}

    def normalise(record: Record) -> Record:
        image = record["image"].astype(np.float32) / np.float32(255) - np.float32(0.5)
        return {"image": image, "label": record["label"]}

    dataset = (
        loadax.RangeDataset(0, records)
        .map(make_record)
        .random_map(augment, seed=AUGMENT_SEED)
        .map(normalise)
    )
    return loadax.Pipeline(dataset, loadax.Batcher())


class Example(TypedDict):
    x: npt.NDArray[np.float32]
    y: np.float32


def true_weights() -> npt.NDArray[np.float32]:
    return np.random.default_rng(TRUE_W_SEED).normal(size=FEATURES).astype(np.float32)


def make_example(index: int) -> Example:
    """Example `index`: its own features and a noisy linear target, the same on every process."""
    rng = np.random.default_rng(index)
    x = rng.normal(size=FEATURES).astype(np.float32)
    y = np.float32(x @ true_weights() + NOISE * rng.normal())
    return {"x": x, "y": y}


def regression_examples(records: int = 512) -> loadax.Dataset[Example]:
    """`records` examples of `FEATURES` features whose target is about `x @ true_weights()`."""
    return loadax.RangeDataset(0, records).map(make_example)


def regression(records: int = 512) -> loadax.Pipeline[Example, Any]:
    """`regression_examples(records)`, stacked into batches."""
    return loadax.Pipeline(regression_examples(records), loadax.Batcher())
