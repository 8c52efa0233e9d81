"""Tests for SlicedDataset, ConcatenatedDataset and RepeatedDataset: lazy, batched, epoch-aware."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from equivalence import digests
from helpers import CountingSource, assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st

import loadax
from loadax import (
    Batcher,
    ConcatenatedDataset,
    DataLoader,
    InMemoryDataset,
    RangeDataset,
    SlicedDataset,
    read_records,
)
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker

bounds = st.none() | st.integers(-40, 40)
steps = st.none() | st.integers(-6, 6).filter(lambda step: step != 0)
lists = st.lists(st.integers(), max_size=30)


def _draw(record: int, rng: np.random.Generator) -> tuple[int, int]:
    return record, int(rng.integers(0, 2**62))


def _record(index: int) -> dict[str, Any]:
    return {"x": np.full(3, index, dtype=np.int64), "y": np.float32(index) / 7}


def _indices(values: Iterable[int]) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.array(list(values), dtype=np.int64)


# --- Python semantics ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(items=lists, start=bounds, stop=bounds, step=steps)
def test_a_slice_equals_the_python_slice(
    items: list[int], start: int | None, stop: int | None, step: int | None
) -> None:
    expected = items[start:stop:step]
    sliced = SlicedDataset(items, start, stop, step)
    assert len(sliced) == len(expected)
    assert list(sliced) == expected
    assert sliced.__getitems__(list(range(len(expected)))[::-1]) == expected[::-1]
    assert list(InMemoryDataset(np.array(items, dtype=object)).slice(start, stop, step)) == expected


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(lists, min_size=1, max_size=6), data=st.data())
def test_a_concatenation_equals_the_list_concatenation(
    parts: list[list[int]], data: st.DataObject
) -> None:
    expected = [item for part in parts for item in part]
    joined = ConcatenatedDataset(parts)
    assert len(joined) == len(expected)
    assert list(joined) == expected
    if expected:
        positions = data.draw(st.lists(st.integers(-len(expected), len(expected) - 1), max_size=40))
        assert joined.__getitems__(positions) == [expected[i] for i in positions]


def test_slices_of_slices_and_concatenations_nest() -> None:
    items = list(range(50))
    nested = RangeDataset(0, 50).slice(-5, 3, -2).slice(1, None, 3)
    assert list(nested) == items[-5:3:-2][1::3]
    chained = RangeDataset(0, 3).concatenate([7, 8], RangeDataset(10, 12).slice(None, None, -1))
    assert list(chained) == [0, 1, 2, 7, 8, 11, 10]
    assert list(chained.slice(2, -1)) == [2, 7, 8, 11]
    assert list(SlicedDataset(np.arange(10), 8, 2, -3)) == [8, 5]


# --- batched reads ---------------------------------------------------------------------------


def test_a_sliced_read_is_one_batched_read_of_the_parent() -> None:
    source = CountingSource(list(range(100, 120)))
    sliced = SlicedDataset(source, 18, 2, -3)  # parent indices 18, 15, 12, 9, 6, 3
    assert sliced.__getitems__([4, 0, 5, 0]) == [106, 118, 103, 118]
    assert source.batches == [[6, 18, 3, 18]]


def test_a_concatenated_read_reads_each_dataset_once_with_local_indices() -> None:
    first, second, third = (CountingSource(list(range(b, b + 4))) for b in (0, 10, 20))
    joined = ConcatenatedDataset([first, [], second, third])
    assert joined.__getitems__([9, 0, 11, 3, 8, 1]) == [21, 0, 23, 3, 20, 1]
    assert first.batches == [[0, 3, 1]]
    assert second.batches == []
    assert third.batches == [[1, 3, 0]]
    assert joined.read(_indices([]), 0) == []
    assert first.batches == [[0, 3, 1]]


def test_the_epoch_passes_through_a_slice() -> None:
    parent = RangeDataset(0, 20).random_map(_draw, seed=3)
    sliced = parent.slice(17, 1, -4)  # parent indices 17, 13, 9, 5
    wanted = _indices([3, 0, 2])
    per_epoch = []
    for epoch in range(3):
        got = sliced.read(wanted, epoch)
        assert got == parent.read(_indices([5, 17, 9]), epoch)
        assert got == read_records(sliced, wanted, epoch)
        per_epoch.append(got)
    assert per_epoch[0] != per_epoch[1] != per_epoch[2]


def test_the_epoch_passes_through_a_concatenation() -> None:
    first = RangeDataset(0, 5).random_map(_draw, seed=1)
    second = RangeDataset(0, 5).random_map(_draw, seed=2)
    joined = first.concatenate(second)
    for epoch in range(3):
        got = joined.read(_indices([7, 1, 5]), epoch)
        assert got == [
            second.read(_indices([2]), epoch)[0],
            first.read(_indices([1]), epoch)[0],
            second.read(_indices([0]), epoch)[0],
        ]
    assert joined.read(_indices([7]), 0) != joined.read(_indices([7]), 1)


def test_a_repetition_reads_each_pass_as_its_own_epoch() -> None:
    parent = RangeDataset(0, 5).random_map(_draw, seed=1)
    repeated = parent.repeat(3)
    assert len(repeated) == 15
    wanted = _indices([14, 0, 7, 5, 2])
    for epoch in range(2):
        got = repeated.read(wanted, epoch)
        assert got == [
            parent.read(_indices([index % 5]), epoch * 3 + index // 5)[0]
            for index in wanted.tolist()
        ]
    shuffled = RangeDataset(0, 6).shuffle(seed=2).repeat(4)
    passes = [list(shuffled)[6 * p : 6 * p + 6] for p in range(4)]
    assert all(sorted(one) == list(range(6)) for one in passes)
    assert len({tuple(one) for one in passes}) == 4, "every pass is shuffled anew"
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        RangeDataset(0, 3).repeat(0)


def test_slice_and_concatenation_compose_with_shuffle_and_map() -> None:
    shuffled = RangeDataset(0, 30).shuffle(seed=4)
    sliced = shuffled.slice(5, 25, 2).map(lambda x: x * 10)
    for epoch in range(2):
        whole = shuffled.read(_indices(range(30)), epoch)
        assert sliced.read(_indices(range(10)), epoch) == [x * 10 for x in whole[5:25:2]]
    reshuffled = RangeDataset(0, 30).slice(3, None, 3).shuffle(seed=4)
    assert sorted(reshuffled) == list(range(3, 30, 3))
    assert list(reshuffled) != list(range(3, 30, 3))
    mixed = ConcatenatedDataset([RangeDataset(0, 5).map(str), ["a", "b"]]).shuffle(seed=1)
    assert sorted(mixed) == sorted(["0", "1", "2", "3", "4", "a", "b"])


# --- loaders ---------------------------------------------------------------------------------


def _loader(dataset: loadax.Dataset[dict[str, Any]], workers: int) -> Any:
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=9).num_epochs(2)
    return builder.workers(workers).build(dataset)


@pytest.mark.parametrize(
    "dataset",
    [
        RangeDataset(0, 60).map(_record).slice(50, 3, -2),
        ConcatenatedDataset(
            [RangeDataset(0, 9).map(_record), [_record(i) for i in range(100, 114)]]
        ),
        RangeDataset(0, 7).map(_record).slice(None, None, -1).repeat(3),
    ],
    ids=["slice", "concatenation", "repetition"],
)
def test_threaded_loaders_give_the_batches_of_the_in_memory_list(
    dataset: loadax.Dataset[dict[str, Any]],
) -> None:
    expected = list(_loader([dataset[i] for i in range(len(dataset))], workers=0))
    assert_batches_equal(_loader(dataset, workers=3), expected)


def test_an_in_process_worker_gives_the_local_batches() -> None:
    images = (
        RangeDataset(0, 40)
        .map(_record)
        .random_map(
            lambda record, rng: {**record, "noise": rng.random(2, dtype=np.float32)}, seed=5
        )
    )
    dataset = images.slice(35, None, -1).concatenate(images.slice(0, 9)).shuffle(seed=2).repeat(2)
    worker = Worker({"p": loadax.Pipeline(dataset, Batcher())}, threads=2)
    try:
        remote = (
            RemoteDataLoader([worker], pipeline="p").batch_size(4).shuffle(seed=9).num_epochs(2)
        )
        with remote.build() as loader:
            expected = digests(_loader(dataset, workers=2))
            assert len(expected) == 46  # 90 records, batches of 4, 2 epochs
            assert digests(loader) == expected
    finally:
        worker.close()


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((None, None, 0), "step must not be zero"),
        (("1", None, None), "start must be an int"),
        ((None, 2.5, None), "stop must be an int"),
        ((None, None, True), "step must be an int"),
    ],
)
def test_bad_slice_arguments_are_named(arguments: tuple[Any, Any, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlicedDataset([1, 2, 3], *arguments)


def test_bad_datasets_are_named() -> None:
    with pytest.raises(ValueError, match="dataset must have __len__"):
        SlicedDataset(42, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="datasets must not be empty"):
        ConcatenatedDataset([])
    with pytest.raises(ValueError, match=r"datasets\[1\]: dataset must have __len__"):
        ConcatenatedDataset([[1], 5])  # type: ignore[list-item]


def test_out_of_range_reads_are_index_errors() -> None:
    with pytest.raises(IndexError, match="out of range"):
        RangeDataset(0, 10).slice(2, 4)[2]
    with pytest.raises(IndexError, match="out of range"):
        ConcatenatedDataset([[1], [2]])[-3]
