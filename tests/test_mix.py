"""Tests for MixedDataset: exact proportions per window, random access, determinism, epochs."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from equivalence import digests
from helpers import CountingSource, assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st

import loadax
from loadax import Batcher, DataLoader, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.dataset.mix import DEFAULT_WINDOW, MixedDataset, window_counts
from loadax.server.worker import Worker


def _draw(record: int, rng: np.random.Generator) -> tuple[int, int]:
    return record, int(rng.integers(0, 2**62))


def _indices(values: Iterable[int]) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.array(list(values), dtype=np.int64)


def _tagged(k: int, length: int) -> list[tuple[int, int]]:
    return [(k, i) for i in range(length)]


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    lengths=st.data(),
    seed=st.integers(0, 2**32),
    extra=st.none() | st.integers(0, 30),
)
def test_every_window_holds_exact_counts_and_each_dataset_is_read_in_order(
    weights: list[int], lengths: st.DataObject, seed: int, extra: int | None
) -> None:
    sizes = lengths.draw(
        st.lists(st.integers(0, 120), min_size=len(weights), max_size=len(weights))
    )
    window = None if extra is None else len(weights) + extra
    datasets = [_tagged(k, n) for k, n in enumerate(sizes)]
    if window is not None and min(weights) * window < sum(weights):
        # Some dataset's ideal share of the window is below one record: that may be an error.
        try:
            window_counts(weights, window)
        except ValueError:
            with pytest.raises(ValueError, match="no record in a window"):
                MixedDataset(datasets, weights, seed, window)
            return
    mixed = MixedDataset(datasets, weights, seed, window)
    counts, size = mixed.counts, mixed.window
    assert sum(counts) == size
    assert min(counts) >= 1
    if window is None:  # integer weights: the smallest exact window
        assert [c * sum(weights) for c in counts] == [w * size for w in weights]
    assert len(mixed) == min(n // c for n, c in zip(sizes, counts, strict=True)) * size
    records = mixed.read(_indices(range(len(mixed))), 0)
    assert records == list(mixed)
    for start in range(0, len(records), size):
        tally = Counter(k for k, _ in records[start : start + size])
        assert [tally[k] for k in range(len(weights))] == list(counts)
    for k, count in enumerate(counts):
        used = [i for owner, i in records if owner == k]
        assert used == list(range(len(records) // size * count))


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 20), min_size=1, max_size=5),
    seed=st.integers(0, 99),
    data=st.data(),
)
def test_random_access_equals_the_sequential_records(
    weights: list[float], seed: int, data: st.DataObject
) -> None:
    mixed = MixedDataset([_tagged(k, 3000) for k in range(len(weights))], weights, seed)
    assert mixed.window <= DEFAULT_WINDOW
    indices = data.draw(st.lists(st.integers(-len(mixed), len(mixed) - 1), max_size=30))
    assert mixed.__getitems__(indices) == [mixed[i] for i in indices]
    wanted = data.draw(st.integers(0, len(mixed) - 1)) if len(mixed) else 0
    if len(mixed):
        start = wanted - wanted % mixed.window
        block = mixed.read(_indices(range(start, start + mixed.window)), 0)
        assert block[wanted - start] == mixed[wanted]


def test_the_smallest_exact_window_is_chosen() -> None:
    assert window_counts([1, 2]) == (1, 2)
    assert window_counts([0.1, 0.2, 0.7]) == (1, 2, 7)
    assert window_counts([3, 3]) == (1, 1)
    assert window_counts([1, 1, 1], window=7) == (3, 2, 2)
    # No exact window up to the default: largest remainders over DEFAULT_WINDOW records.
    assert window_counts([1, 1e-3]) == (999, 1)
    assert sum(window_counts([1, 1.5, 2**0.5])) == DEFAULT_WINDOW


def test_the_mixture_ends_at_the_first_exhausted_dataset() -> None:
    mixed = MixedDataset([_tagged(0, 10), _tagged(1, 100)], [1, 3], seed=1)
    assert (mixed.window, mixed.counts, len(mixed)) == (4, (1, 3), 40)
    assert sorted(i for k, i in mixed if k == 0) == list(range(10))
    assert max(i for k, i in mixed if k == 1) == 29
    assert len(MixedDataset([[], [1, 2]], [1, 1])) == 0


def test_the_same_arguments_give_the_same_mixture_and_seeds_differ() -> None:
    def build(seed: int | None) -> list[Any]:
        mixed = MixedDataset([_tagged(0, 500), _tagged(1, 500)], [1, 1], seed, window=50)
        return mixed.read(_indices(range(len(mixed))), 0)

    assert build(None) == build(0) == build(0)
    assert build(1) == build(1)
    assert build(1) != build(2)
    assert sorted(build(1)) == sorted(build(2))


def test_a_read_reads_each_dataset_once() -> None:
    first, second = CountingSource(_tagged(0, 20)), CountingSource(_tagged(1, 20))
    mixed = MixedDataset([first, second], [1, 1], seed=3, window=4)
    got = mixed.__getitems__([9, 0, 17, 3, 2, 30])
    assert len(first.batches) == len(second.batches) == 1
    assert sorted(first.batches[0] + second.batches[0]) == sorted(i for _, i in got)
    assert mixed.read(_indices([]), 0) == []


def test_the_epoch_passes_through_and_the_layout_does_not_change() -> None:
    parts = [RangeDataset(0, 40).random_map(_draw, seed=k) for k in range(2)]
    mixed = MixedDataset(parts, [2, 1], seed=5)
    tags = MixedDataset([_tagged(0, 40), _tagged(1, 40)], [2, 1], seed=5)
    positions = _indices([7, 0, 31, 12, 8])
    per_epoch = []
    for epoch in range(3):
        got = mixed.read(positions, epoch)
        expected = [parts[k].read(_indices([i]), epoch)[0] for k, i in tags.read(positions, 0)]
        assert got == expected
        per_epoch.append(got)
    assert per_epoch[0] != per_epoch[1] != per_epoch[2]


def _record(k: int, i: int) -> dict[str, Any]:
    return {"x": np.full(2, 1000 * k + i, dtype=np.int64), "k": np.int32(k)}


def _mixture() -> MixedDataset[dict[str, Any]]:
    parts = [RangeDataset(0, n).map(functools.partial(_record, k)) for k, n in enumerate([30, 50])]
    return MixedDataset(parts, [0.4, 0.6], seed=7)


def _loader(dataset: loadax.Dataset[Any], workers: int) -> Any:
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=9).num_epochs(2)
    return builder.workers(workers).build(dataset)


def test_loaders_with_any_worker_count_give_the_same_batches() -> None:
    mixed = _mixture()
    expected = list(_loader([mixed[i] for i in range(len(mixed))], workers=0))
    assert (mixed.counts, len(mixed), len(expected)) == ((2, 3), 75, 38)  # 19 batches an epoch
    for workers in (0, 1, 3):
        assert_batches_equal(_loader(mixed, workers), expected)


def test_an_in_process_worker_gives_the_local_batches() -> None:
    mixed = _mixture()
    worker = Worker({"p": loadax.Pipeline(mixed, Batcher())}, threads=2)
    try:
        remote = (
            RemoteDataLoader([worker], pipeline="p").batch_size(4).shuffle(seed=9).num_epochs(2)
        )
        with remote.build() as loader:
            assert digests(loader) == digests(_loader(mixed, workers=2))
    finally:
        worker.close()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (([], []), "datasets must not be empty"),
        (([[1], 5], [1, 1]), r"datasets\[1\]: dataset must have __len__"),
        (([[1], [2]], [1]), "weights has 1 entries but there are 2 datasets"),
        (([[1], [2]], [1, 0]), r"weights\[1\] must be positive"),
        (([[1], [2]], [1, -2.0]), r"weights\[1\] must be positive"),
        (([[1], [2]], [float("nan"), 1]), r"weights\[0\] must be positive"),
        (([[1], [2]], [float("inf"), 1]), r"weights\[0\] must be positive"),
        (([[1], [2]], [1, "2"]), r"weights\[1\] must be a number"),
        (([[1], [2]], [True, 1]), r"weights\[0\] must be a number"),
        (([[1], [2]], [1, 1], -1), "seed must be >= 0"),
        (([[1], [2]], [1, 1], 0, 1), "window must be >= 2"),
        (([[1], [2]], [1, 1], 0, 2.0), "window must be an int"),
        (([[1], [2]], [1, 1e-3], 0, 10), r"weights\[1\] = 0.001 gives dataset 1 no record"),
    ],
)
def test_bad_arguments_are_named(arguments: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MixedDataset(*arguments)


def test_out_of_range_reads_are_index_errors() -> None:
    with pytest.raises(IndexError, match="out of range"):
        MixedDataset([[1, 2], [3, 4]], [1, 1])[4]
