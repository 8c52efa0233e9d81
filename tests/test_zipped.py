"""Tests for loadax/dataset/zipped.py: equal-length datasets joined record by record."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import CountingSource, assert_batches_equal

from loadax import (
    Batcher,
    DataLoader,
    DatasetBase,
    InMemoryDataset,
    NumpyDataset,
    RangeDataset,
    ZippedDataset,
)
from loadax.plan.permutation import IndexArray


class Letters(DatasetBase[str]):
    """Record i is the i-th letter, tagged with the epoch it was read in; reads are logged."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.reads: list[list[int]] = []

    def __len__(self) -> int:
        return self.size

    def read(self, indices: IndexArray, epoch: int) -> list[str]:
        self.reads.append(indices.tolist())
        return [f"{chr(ord('a') + index)}{epoch}" for index in indices.tolist()]


def test_a_sequence_of_datasets_gives_tuples() -> None:
    zipped = ZippedDataset([RangeDataset(10, 14), Letters(4), [0.5, 1.5, 2.5, 3.5]])
    assert len(zipped) == 4
    assert list(zipped) == [(10, "a0", 0.5), (11, "b0", 1.5), (12, "c0", 2.5), (13, "d0", 3.5)]
    assert zipped[-1] == (13, "d0", 3.5)
    assert zipped.__getitems__([2, 0]) == [(12, "c0", 2.5), (10, "a0", 0.5)]


def test_a_mapping_of_datasets_gives_dicts_in_its_key_order() -> None:
    zipped = ZippedDataset({"label": [7, 8, 9], "image": InMemoryDataset(np.eye(3))})
    record = zipped[1]
    assert list(record) == ["label", "image"]
    assert record["label"] == 8
    np.testing.assert_array_equal(record["image"], [0.0, 1.0, 0.0])
    assert isinstance(zipped.datasets, dict)
    assert list(zipped.datasets) == ["label", "image"]


def test_a_batched_read_reads_each_part_once_with_its_batched_read() -> None:
    letters, foreign = Letters(6), CountingSource(list(range(100, 106)))
    zipped = ZippedDataset({"letter": letters, "number": foreign})
    assert zipped.__getitems__([5, 1, 3]) == [
        {"letter": "f0", "number": 105},
        {"letter": "b0", "number": 101},
        {"letter": "d0", "number": 103},
    ]
    assert letters.reads == [[5, 1, 3]]
    assert foreign.batches == [[5, 1, 3]]


def test_a_loader_reads_each_part_once_per_batch() -> None:
    letters, foreign = Letters(10), CountingSource(list(range(10)))
    zipped = ZippedDataset([letters, foreign])
    loader = DataLoader(Batcher(list)).batch_size(4).workers(0).build(zipped)
    batches = list(loader)
    assert [len(batch) for batch in batches] == [4, 4, 2]
    assert batches[2] == [("i0", 8), ("j0", 9)]
    assert letters.reads == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert foreign.batches == letters.reads


def test_every_part_is_read_in_the_epoch_of_the_read() -> None:
    letters = Letters(4)
    shuffled = RangeDataset(0, 4).shuffle(seed=2)
    zipped = ZippedDataset([letters, shuffled])
    indices = np.arange(4)
    for epoch in (0, 1):
        expected = zip(letters.read(indices, epoch), shuffled.read(indices, epoch), strict=True)
        assert zipped.read(indices, epoch) == list(expected)
    assert zipped.read(indices, 0) != zipped.read(indices, 1)


def test_different_lengths_are_a_value_error_naming_each_part_and_length() -> None:
    with pytest.raises(ValueError, match=r"one length, got datasets\[0\]: 3, datasets\[1\]: 2"):
        ZippedDataset([RangeDataset(0, 3), [1, 2]])
    with pytest.raises(ValueError, match="one length, got 'image': 4, 'label': 5, 'weight': 4"):
        ZippedDataset({"image": Letters(4), "label": RangeDataset(0, 5), "weight": [1] * 4})


def test_invalid_datasets_are_refused_naming_the_part() -> None:
    with pytest.raises(ValueError, match="datasets must not be empty"):
        ZippedDataset([])
    with pytest.raises(ValueError, match="datasets must not be empty"):
        ZippedDataset({})
    with pytest.raises(ValueError, match="sequence or a mapping of datasets, got int"):
        ZippedDataset(3)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=r"dataset 'label': .*__len__ and __getitem__, got int"):
        ZippedDataset({"image": [1], "label": 5})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"dataset datasets\[1\]: .*got generator"):
        ZippedDataset([[1], (x for x in [1])])  # type: ignore[list-item]


def test_a_part_that_returns_the_wrong_number_of_records_is_named() -> None:
    class Short(CountingSource):
        def __getitems__(self, indices: list[int]) -> list[Any]:
            return super().__getitems__(indices)[:-1]

    zipped = ZippedDataset({"ok": [1, 2, 3], "short": Short([1, 2, 3])})
    with pytest.raises(ValueError, match="dataset 'short' gave 1 records for a read of 2"):
        zipped.__getitems__([0, 1])


def test_ops_chain_on_a_zipped_dataset() -> None:
    zipped = ZippedDataset({"x": RangeDataset(0, 6), "y": Letters(6)})
    chained = zipped.shuffle(seed=4).map(lambda r: f"{r['x']}{r['y']}").slice(1, None, 2)
    assert len(chained) == 3
    whole = [f"{r['x']}{r['y']}" for r in zipped.shuffle(seed=4)]
    assert list(chained) == whole[1::2]
    assert sorted(whole) == [f"{i}{chr(ord('a') + i)}0" for i in range(6)]


def test_a_loader_stacks_zipped_records_and_a_pickled_copy_reads_the_same(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(6, 2))
    zipped = ZippedDataset({"x": NumpyDataset(tmp_path / "x.npy"), "label": RangeDataset(0, 6)})
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=0).workers(2)
    batches = list(builder.build(zipped))
    assert batches[0]["x"].shape == (4, 2)
    np.testing.assert_array_equal(batches[0]["x"][:, 0], 2 * batches[0]["label"])
    assert_batches_equal(builder.build(pickle.loads(pickle.dumps(zipped))), batches)


def test_repr_shows_each_part() -> None:
    zipped = ZippedDataset({"image": RangeDataset(0, 3), "label": [0, 1, 2]})
    assert repr(zipped) == "ZippedDataset({'image': RangeDataset(0, 3), 'label': [0, 1, 2]})"
    pairs = ZippedDataset([RangeDataset(0, 1000), list(range(1000))])
    assert repr(pairs) == "ZippedDataset([RangeDataset(0, 1000), [0, 1, 2, 3, 4, 5, ...]])"
