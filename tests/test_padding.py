"""Tests for pad_batcher: padded shapes, pad values, masks, a fixed length, and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from equivalence import digests
from helpers import assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st

import loadax
from loadax import DataLoader, RangeDataset, stack
from loadax.client import RemoteDataLoader
from loadax.collate.padding import PaddedStack, pad_batcher
from loadax.dataset.mix import MixedDataset
from loadax.server.worker import Worker


def _tokens(index: int) -> dict[str, Any]:
    return {
        "tokens": np.arange(index % 5, dtype=np.int32) + 1,
        "pixels": np.full((index % 3 + 1, 2), index, dtype=np.float32),
        "label": np.int64(index),
    }


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 8), min_size=1, max_size=6),
    pad=st.integers(-5, 5),
    fixed=st.none() | st.integers(8, 10),
)
def test_ragged_leaves_are_padded_and_masked(
    lengths: list[int], pad: int, fixed: int | None
) -> None:
    records = [
        {"x": np.arange(n, dtype=np.int16) + 10, "y": np.float32(n), "z": np.ones((n, 3))}
        for n in lengths
    ]
    batch = pad_batcher(pad, length=fixed)(records)
    size = max(lengths) if fixed is None else fixed
    assert sorted(batch) == ["x", "x_mask", "y", "z", "z_mask"]
    assert batch["x"].shape == (len(lengths), size)
    assert batch["x"].dtype == np.int16
    assert batch["z"].shape == (len(lengths), size, 3)
    np.testing.assert_array_equal(batch["y"], np.array(lengths, dtype=np.float32))
    for row, n in enumerate(lengths):
        np.testing.assert_array_equal(batch["x"][row, :n], np.arange(n) + 10)
        assert (batch["x"][row, n:] == pad).all()
        assert (batch["z"][row, n:] == pad).all()
        expected_mask = np.arange(size) < n
        np.testing.assert_array_equal(batch["x_mask"][row], expected_mask)
        np.testing.assert_array_equal(batch["z_mask"][row], expected_mask)
        assert batch["x_mask"].dtype == np.bool_


def test_equal_shapes_stack_like_the_default_plus_masks() -> None:
    records = [{"x": np.arange(3) * i, "y": np.float32(i)} for i in range(4)]
    batch = pad_batcher()(records)
    expected = stack(records)
    np.testing.assert_array_equal(batch["x"], expected["x"])
    np.testing.assert_array_equal(batch["y"], expected["y"])
    assert batch["x_mask"].all()
    assert batch["x_mask"].shape == (4, 3)


def test_non_dict_records_are_padded_without_masks() -> None:
    records = [(np.arange(2), {"a": np.arange(1)}), (np.arange(3), {"a": np.arange(4)})]
    batch = pad_batcher(-1)(records)
    np.testing.assert_array_equal(batch[0], [[0, 1, -1], [0, 1, 2]])
    np.testing.assert_array_equal(batch[1]["a"], [[0, -1, -1, -1], [0, 1, 2, 3]])
    np.testing.assert_array_equal(pad_batcher(length=3)([np.arange(1)]), [[0, 0, 0]])


def test_only_the_named_keys_are_padded() -> None:
    records = [
        {"tokens": np.arange(n), "image": np.zeros((2, 2)), "meta": {"a": np.arange(n)}}
        for n in (1, 3)
    ]
    batch = pad_batcher(keys=["tokens", "meta"], length=4)(records)
    assert sorted(batch) == ["image", "meta", "tokens", "tokens_mask"]  # nested: no mask
    assert batch["image"].shape == (2, 2, 2)
    assert batch["tokens"].shape == batch["meta"]["a"].shape == (2, 4)
    with pytest.raises(ValueError, match="all input arrays must have the same shape"):
        pad_batcher(keys=["tokens"])(records)  # meta is ragged but not padded


def test_the_default_stack_names_a_ragged_leaf_and_points_at_padding() -> None:
    message = (
        r"^leaf \['x'\] of record 1 has shape \(2,\), but record 0's has shape \(3,\); "
        r"pad ragged leaves with loadax.pad_batcher"
    )
    with pytest.raises(ValueError, match=message):
        stack([{"x": np.arange(3)}, {"x": np.arange(2)}])
    with pytest.raises(ValueError, match=r"leaf \(the record itself\) of record 2"):
        stack([np.zeros(2), np.zeros(2), np.zeros(4)])


@pytest.mark.parametrize(
    ("batcher", "records", "message"),
    [
        (pad_batcher(length=2), [{"x": np.arange(1)}, {"x": np.arange(3)}], None),
        (pad_batcher(), [], "cannot stack an empty list of records"),
        (
            pad_batcher(),
            [{"x": np.zeros((2, 3))}, {"x": np.zeros((2, 4))}],
            r"leaf \['x'\] of record 1 has shape \(2, 4\), but record 0's has \(2, 3\)",
        ),
        (
            pad_batcher(),
            [{"x": np.zeros(2)}, {"x": np.float32(1)}],
            r"leaf \['x'\] of record 1 has shape \(\), but record 0's has \(2,\)",
        ),
        (pad_batcher(), [{"x": 1}, {"y": 1}], r"record 1 of the batch has keys \['y'\]"),
        (pad_batcher(), [{"x": 1}, [1]], r"record 1 of the batch has keys list"),
        (
            pad_batcher(),
            [{"x": {"a": 1}}, {"x": [1]}],
            r"\['x'\] of record 1 of the batch has structure",
        ),
        (pad_batcher(keys=["y"]), [{"x": 1}], r"key 'y' is not in the records' keys \['x'\]"),
        (pad_batcher(keys=["x"]), [[1]], "keys needs dict records, got list"),
        (
            pad_batcher(),
            [{"x": np.arange(2), "x_mask": 1}],
            "the mask 'x_mask' would replace the record's own key 'x_mask'",
        ),
    ],
)
def test_bad_batches_are_named(
    batcher: loadax.Batcher[Any, Any], records: list[Any], message: str | None
) -> None:
    message = message or r"leaf \['x'\] of record 1 has length 3, longer than length=2"
    with pytest.raises(ValueError, match=message):
        batcher(records)


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match="length must be >= 0"):
        pad_batcher(length=-1)
    with pytest.raises(ValueError, match="length must be an int"):
        pad_batcher(length=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keys must be strings"):
        pad_batcher(keys=[1])  # type: ignore[list-item]
    assert repr(PaddedStack(-1, 4, ["x"])) == "PaddedStack(pad_value=-1, length=4, keys=('x',))"


def _dataset() -> loadax.Dataset[dict[str, Any]]:
    parts = [RangeDataset(0, 40).map(_tokens), RangeDataset(100, 130).map(_tokens)]
    return MixedDataset(parts, [2, 1], seed=3)


def _loader(dataset: loadax.Dataset[Any], workers: int, length: int | None) -> Any:
    builder = DataLoader(pad_batcher(-1, length)).batch_size(5).shuffle(seed=4).num_epochs(2)
    return builder.workers(workers).build(dataset)


@pytest.mark.parametrize("length", [None, 6])
def test_padded_pipelines_are_the_same_locally_threaded_and_remote(length: int | None) -> None:
    dataset = _dataset()
    expected = list(_loader([dataset[i] for i in range(len(dataset))], 0, length))
    assert len(expected) == 24  # 60 records, batches of 5, 2 epochs
    assert_batches_equal(_loader(dataset, 3, length), expected)
    worker = Worker({"p": loadax.Pipeline(dataset, pad_batcher(-1, length))}, threads=2)
    try:
        remote = (
            RemoteDataLoader([worker], pipeline="p").batch_size(5).shuffle(seed=4).num_epochs(2)
        )
        with remote.build() as loader:
            assert digests(loader) == digests(expected)
    finally:
        worker.close()
