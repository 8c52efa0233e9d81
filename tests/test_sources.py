"""Tests for loadax/sources.py: in-memory sequences and arrays, and ranges of ints."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax import InMemoryDataset, RangeDataset


@pytest.mark.parametrize("items", [["a", "b", "c", "d"], ("a", "b", "c", "d")])
def test_in_memory_dataset_reads_a_sequence(items: Any) -> None:
    dataset = InMemoryDataset(items)
    assert len(dataset) == 4
    assert list(dataset) == ["a", "b", "c", "d"]
    assert dataset[-1] == "d"
    assert dataset.__getitems__([3, 0, 3]) == ["d", "a", "d"]
    assert dataset.read(np.array([1, 2], dtype=np.int64), 0) == ["b", "c"]


def test_in_memory_dataset_reads_rows_of_an_array() -> None:
    array = np.arange(15, dtype=np.float32).reshape(5, 3)
    dataset = InMemoryDataset(array)
    assert len(dataset) == 5
    rows = dataset.read(np.array([4, 0, 2], dtype=np.int64), 0)
    assert len(rows) == 3
    for row, expected in zip(rows, [[12, 13, 14], [0, 1, 2], [6, 7, 8]], strict=True):
        assert row.dtype == np.float32
        assert row.tolist() == expected
    assert dataset[-2].tolist() == [9.0, 10.0, 11.0]


def test_in_memory_dataset_of_a_one_dimensional_array_reads_scalars() -> None:
    dataset = InMemoryDataset(np.array([7, 8, 9], dtype=np.int16))
    records = dataset.__getitems__([2, 0])
    assert [int(r) for r in records] == [9, 7]
    assert all(r.dtype == np.int16 for r in records)


def test_in_memory_dataset_wraps_without_copying() -> None:
    array = np.zeros((3, 2), dtype=np.int64)
    items = [1, 2, 3]
    from_array, from_list = InMemoryDataset(array), InMemoryDataset(items)
    array[1] = [5, 6]
    items[2] = 30
    assert from_array[1].tolist() == [5, 6]
    assert from_list[2] == 30


def test_in_memory_dataset_of_nothing_is_empty() -> None:
    dataset = InMemoryDataset([])
    assert len(dataset) == 0
    assert list(dataset) == []
    with pytest.raises(IndexError, match="index 0 "):
        dataset[0]


@pytest.mark.parametrize("items", [5, None, (x for x in range(3)), {1, 2}])
def test_in_memory_dataset_of_a_non_dataset_raises_value_error(items: Any) -> None:
    with pytest.raises(ValueError, match="dataset must have __len__ and __getitem__"):
        InMemoryDataset(items)


def test_in_memory_dataset_transforms_chain() -> None:
    dataset = InMemoryDataset(np.arange(6) * 2).map(lambda x: int(x) + 1)
    assert list(dataset) == [1, 3, 5, 7, 9, 11]


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(-1000, 1000),
    stop=st.integers(-1000, 1000),
    step=st.integers(-50, 50).filter(lambda step: step != 0),
)
def test_range_dataset_matches_python_range(start: int, stop: int, step: int) -> None:
    expected = range(start, stop, step)
    dataset = RangeDataset(start, stop, step)
    assert len(dataset) == len(expected)
    assert list(dataset) == list(expected)
    if expected:
        positions = [0, len(expected) - 1, -1, -len(expected), len(expected) // 2]
        assert dataset.__getitems__(positions) == [expected[p] for p in positions]
    for outside in (len(expected), -len(expected) - 1):
        with pytest.raises(IndexError):
            dataset[outside]


def test_range_dataset_defaults_to_step_one() -> None:
    assert list(RangeDataset(3, 7)) == [3, 4, 5, 6]


@pytest.mark.parametrize(
    ("start", "stop", "step"), [(0, 0, 1), (5, 0, 1), (0, 5, -1), (-3, -3, -2)]
)
def test_empty_range_dataset(start: int, stop: int, step: int) -> None:
    dataset = RangeDataset(start, stop, step)
    assert len(dataset) == 0
    assert list(dataset) == []


def test_range_dataset_reads_python_ints() -> None:
    records = RangeDataset(0, 10).read(np.array([3, 9], dtype=np.int64), 0)
    assert records == [3, 9]
    assert all(type(record) is int for record in records)


def test_range_dataset_of_a_trillion_ints() -> None:
    dataset = RangeDataset(0, 10**12)
    assert len(dataset) == 10**12
    assert dataset[-1] == 10**12 - 1
    assert dataset[123_456_789_012] == 123_456_789_012
    backwards = RangeDataset(10**12, 0, -3)
    assert len(backwards) == len(range(10**12, 0, -3))
    assert backwards[-1] == range(10**12, 0, -3)[-1]


def test_range_dataset_repr() -> None:
    assert repr(RangeDataset(1, 10, 2)) == "RangeDataset(1, 10, 2)"
    assert repr(RangeDataset(4, -4, -1)) == "RangeDataset(4, -4, -1)"


def test_range_dataset_step_zero_raises_value_error() -> None:
    with pytest.raises(ValueError, match="step"):
        RangeDataset(0, 10, 0)


def test_range_dataset_accepts_numpy_ints() -> None:
    dataset = RangeDataset(np.int64(2), np.int32(8), np.int8(3))
    assert list(dataset) == [2, 5]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("start", 0.0),
        ("start", "0"),
        ("start", None),
        ("start", True),
        ("stop", 10.5),
        ("stop", "10"),
        ("stop", False),
        ("step", 1.0),
        ("step", True),
        ("step", None),
    ],
)
def test_range_dataset_bad_types_raise_value_error_naming_the_argument(
    argument: str, value: Any
) -> None:
    arguments: dict[str, Any] = {"start": 0, "stop": 10, "step": 1, argument: value}
    with pytest.raises(ValueError, match=argument):
        RangeDataset(**arguments)
