"""`Loader.check_determinism`: a pipeline's first batches, loaded twice, are equal byte for byte,
or the error names the first step and leaf that differ."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from loadax import Batcher, DataLoader, RangeDataset


def record(index: int) -> dict[str, Any]:
    return {"id": np.int64(index), "x": np.full(2, index, np.float32)}


def noisy_x(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "x": item["x"] + np.random.random(2).astype(np.float32)}


def jittered(item: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {**item, "x": item["x"] + rng.random(2).astype(np.float32)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_map_that_draws_from_np_random_without_a_seed_is_not_deterministic(
    workers: int,
) -> None:
    dataset = RangeDataset(0, 16).map(record).map(noisy_x)
    loader = DataLoader(Batcher()).batch_size(4).workers(workers).build(dataset)
    with pytest.raises(ValueError, match=r"not deterministic: step 0, leaf \['x'\] differs") as e:
        loader.check_determinism(steps=2)
    assert "use random_map" in str(e.value).lower()
    assert loader.stats().batches == 0  # the check's loads are not the training loop's


def test_a_python_random_in_a_stream_filter_is_not_deterministic() -> None:
    stream = RangeDataset(0, 64).map(record).filter(lambda _: random.random() < 0.5)
    loader = DataLoader(Batcher()).batch_size(4).build(stream)
    # Two loads may keep the same first records by chance: the first step that differs is named.
    with pytest.raises(ValueError, match=r"the pipeline is not deterministic: step [0-2],"):
        loader.check_determinism(steps=3)


def test_seeded_randomness_shuffling_and_device_prefetch_are_deterministic() -> None:
    dataset = RangeDataset(0, 16).map(record).random_map(jittered, seed=3)
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=1).workers(2)
    builder.build(dataset).check_determinism(steps=4)
    builder.device_prefetch(2).build(dataset).check_determinism()


def test_steps_must_be_a_positive_int() -> None:
    loader = DataLoader(Batcher()).batch_size(4).build(RangeDataset(0, 8))
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        loader.check_determinism(steps=0)
