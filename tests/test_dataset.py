"""Tests for loadax/dataset.py: lazy, random-access transforms, and record errors of a pipeline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax import (
    Batcher,
    InMemoryDataset,
    MappedDataset,
    Pipeline,
    RandomMappedDataset,
    RangeDataset,
    RecordError,
    ShuffledDataset,
    read_records,
)
from loadax.plan.permutation import KeyPurpose, derive_key, permute, record_rng


class CountingFn:
    """Multiplies by ten and remembers every record it was called with."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, record: int) -> int:
        self.calls.append(record)
        return record * 10


class RecordingSource:
    """A foreign dataset with `__getitem__` only, logging how it is read."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.calls: list[tuple[str, Any]] = []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        self.calls.append(("getitem", index))
        return self.items[index]


class BatchedRecordingSource(RecordingSource):
    """A foreign dataset that also has the batched `__getitems__`."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self.calls.append(("getitems", list(indices)))
        return [self.items[index] for index in indices]


def _draw(record: int, rng: np.random.Generator) -> tuple[int, int]:
    return record, int(rng.integers(0, 2**62))


# --- MappedDataset ---------------------------------------------------------------------------


def test_map_applies_fn_to_every_record() -> None:
    dataset = RangeDataset(0, 5).map(lambda x: x * x)
    assert isinstance(dataset, MappedDataset)
    assert len(dataset) == 5
    assert list(dataset) == [0, 1, 4, 9, 16]


def test_map_is_lazy_and_calls_fn_once_per_read_record() -> None:
    fn = CountingFn()
    dataset = InMemoryDataset(list(range(10))).map(fn)
    assert fn.calls == []
    assert dataset[3] == 30
    assert fn.calls == [3]
    assert dataset.__getitems__([7, 1, 7]) == [70, 10, 70]
    assert fn.calls == [3, 7, 1, 7]


def test_maps_chain_in_order() -> None:
    dataset = RangeDataset(0, 4).map(lambda x: x + 1).map(lambda x: x * 3)
    assert list(dataset) == [3, 6, 9, 12]


def test_map_works_over_a_plain_list() -> None:
    dataset = MappedDataset(["a", "bb", "ccc"], len)
    assert list(dataset) == [1, 2, 3]
    assert dataset[-1] == 3


def test_map_works_over_a_numpy_array() -> None:
    array = np.arange(12).reshape(4, 3)
    dataset = MappedDataset(array, lambda row: int(row.sum()))
    assert len(dataset) == 4
    assert list(dataset) == [3, 12, 21, 30]


@pytest.mark.parametrize("fn", [None, 3, "upper"])
def test_non_callable_fn_raises_value_error_naming_it(fn: Any) -> None:
    with pytest.raises(ValueError, match="fn"):
        MappedDataset([1, 2], fn)
    with pytest.raises(ValueError, match="fn"):
        RangeDataset(0, 2).map(fn)
    with pytest.raises(ValueError, match="fn"):
        RandomMappedDataset([1, 2], fn)
    with pytest.raises(ValueError, match="fn"):
        RangeDataset(0, 2).random_map(fn)


@pytest.mark.parametrize("parent", [42, None, iter([1, 2])])
def test_a_non_dataset_parent_raises_value_error(parent: Any) -> None:
    with pytest.raises(ValueError, match="dataset must have __len__ and __getitem__"):
        MappedDataset(parent, str)
    with pytest.raises(ValueError, match="dataset must have __len__ and __getitem__"):
        RandomMappedDataset(parent, _draw)
    with pytest.raises(ValueError, match="dataset must have __len__ and __getitem__"):
        ShuffledDataset(parent)


# --- Python indexing rules -------------------------------------------------------------------

DATASETS = {
    "mapped": lambda: RangeDataset(0, 6).map(lambda x: x + 100),
    "random_mapped": lambda: RangeDataset(0, 6).random_map(lambda x, rng: x + 100),
    "shuffled": lambda: RangeDataset(100, 106).shuffle(seed=1),
}


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_negative_indices_count_from_the_end(name: str) -> None:
    dataset = DATASETS[name]()
    records = list(dataset)
    assert sorted(records) == list(range(100, 106))
    assert dataset[-1] == records[5]
    assert dataset[-6] == records[0]
    assert dataset[np.int64(-2)] == records[4]


@pytest.mark.parametrize("name", sorted(DATASETS))
@pytest.mark.parametrize("index", [6, 7, -7, 10**12])
def test_out_of_range_index_raises_index_error(name: str, index: int) -> None:
    with pytest.raises(IndexError, match=rf"index {index} "):
        DATASETS[name]()[index]


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_out_of_range_index_in_a_batch_raises_index_error(name: str) -> None:
    with pytest.raises(IndexError, match="index 6 "):
        DATASETS[name]().__getitems__([0, 6])


@pytest.mark.parametrize("name", sorted(DATASETS))
@pytest.mark.parametrize("index", [1.0, "1", None, slice(0, 2), [1]])
def test_non_int_index_raises_type_error(name: str, index: Any) -> None:
    with pytest.raises(TypeError, match="must be ints"):
        DATASETS[name]()[index]


@settings(max_examples=40, deadline=None)
@given(indices=st.lists(st.integers(min_value=-6, max_value=5), max_size=12))
def test_getitems_equals_reading_each_index(indices: list[int]) -> None:
    for make in DATASETS.values():
        dataset = make()
        assert dataset.__getitems__(indices) == [dataset[index] for index in indices]


def test_iterating_yields_each_index_in_order() -> None:
    dataset = RangeDataset(0, 9).shuffle(seed=2)
    assert list(dataset) == [dataset[index] for index in range(9)]


# --- read_records ----------------------------------------------------------------------------


def test_read_records_uses_getitems_when_present() -> None:
    source = BatchedRecordingSource(list("abcdef"))
    assert read_records(source, np.array([4, 0, 4], dtype=np.int64)) == ["e", "a", "e"]
    assert source.calls == [("getitems", [4, 0, 4])]


def test_read_records_falls_back_to_getitem() -> None:
    source = RecordingSource(list("abcdef"))
    assert read_records(source, np.array([4, 0], dtype=np.int64)) == ["e", "a"]
    assert source.calls == [("getitem", 4), ("getitem", 0)]


def test_transforms_read_a_foreign_dataset_in_one_batched_call() -> None:
    source = BatchedRecordingSource(list(range(10)))
    dataset = MappedDataset(source, lambda x: -x)
    assert dataset.__getitems__([2, 5, -1]) == [-2, -5, -9]
    assert source.calls == [("getitems", [2, 5, 9])]


@pytest.mark.parametrize("items", [[5, 6, 7], (5, 6, 7), np.array([5, 6, 7])])
def test_read_records_reads_plain_sequences(items: Any) -> None:
    assert [int(x) for x in read_records(items, np.array([2, 0], dtype=np.int64))] == [7, 5]


def test_read_records_passes_the_epoch_to_loadax_datasets() -> None:
    dataset = RangeDataset(0, 4).random_map(_draw, seed=8)
    indices = np.array([1, 3], dtype=np.int64)
    assert read_records(dataset, indices, 5) == dataset.read(indices, 5)
    assert read_records(dataset, indices, 5) != dataset.read(indices, 0)


# --- RandomMappedDataset ---------------------------------------------------------------------


def test_random_map_rng_is_the_record_rng_of_seed_epoch_and_index() -> None:
    dataset = RangeDataset(10, 20).random_map(_draw, seed=4)
    assert isinstance(dataset, RandomMappedDataset)
    expected = [(10 + i, int(record_rng(4, 0, i).integers(0, 2**62))) for i in range(10)]
    assert list(dataset) == expected
    epoch_three = dataset.read(np.arange(10, dtype=np.int64), 3)
    assert epoch_three == [(10 + i, int(record_rng(4, 3, i).integers(0, 2**62))) for i in range(10)]


def test_random_map_gives_the_same_value_for_the_same_record_read_twice() -> None:
    dataset = RangeDataset(0, 50).random_map(_draw, seed=1)
    assert dataset[17] == dataset[17]
    assert dataset[-1] == dataset[49]


@settings(max_examples=30, deadline=None)
@given(
    index=st.integers(0, 49),
    others=st.lists(st.integers(0, 49), max_size=10),
    epoch=st.integers(0, 5),
)
def test_random_map_value_does_not_depend_on_the_rest_of_the_batch(
    index: int, others: list[int], epoch: int
) -> None:
    dataset = RangeDataset(0, 50).random_map(_draw, seed=2)
    alone = dataset.read(np.array([index], dtype=np.int64), epoch)[0]
    batch = dataset.read(np.array([*others, index, *others], dtype=np.int64), epoch)
    assert batch[len(others)] == alone


def test_random_map_differs_across_epochs() -> None:
    dataset = RangeDataset(0, 20).random_map(_draw, seed=2)
    indices = np.arange(20, dtype=np.int64)
    epochs = [tuple(dataset.read(indices, epoch)) for epoch in range(4)]
    assert len(set(epochs)) == 4
    for epoch in range(1, 4):
        assert all(a != b for a, b in zip(epochs[0], epochs[epoch], strict=True))


def test_random_map_differs_across_seeds_and_none_is_seed_zero() -> None:
    base = RangeDataset(0, 20)
    assert list(base.random_map(_draw)) == list(base.random_map(_draw, seed=0))
    assert list(base.random_map(_draw, seed=0)) != list(base.random_map(_draw, seed=1))


def test_random_map_is_lazy() -> None:
    calls: list[int] = []

    def fn(record: int, rng: np.random.Generator) -> int:
        calls.append(record)
        return record

    dataset = RangeDataset(0, 5).random_map(fn)
    assert calls == []
    dataset.__getitems__([4, 2])
    assert calls == [4, 2]


# --- ShuffledDataset -------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32))
def test_shuffle_is_a_permutation_of_its_parent(n: int, seed: int) -> None:
    dataset = RangeDataset(1000, 1000 + n).shuffle(seed)
    assert isinstance(dataset, ShuffledDataset)
    assert len(dataset) == n
    assert sorted(dataset) == list(range(1000, 1000 + n))


def test_shuffle_changes_the_order() -> None:
    assert list(RangeDataset(0, 30).shuffle(seed=0)) != list(range(30))


def test_shuffle_reshuffles_every_epoch() -> None:
    dataset = RangeDataset(0, 30).shuffle(seed=6)
    indices = np.arange(30, dtype=np.int64)
    orders = [tuple(dataset.read(indices, epoch)) for epoch in range(5)]
    assert len(set(orders)) == 5
    assert all(sorted(order) == list(range(30)) for order in orders)
    assert list(orders[0]) == list(dataset)


def test_shuffle_seed_none_equals_seed_zero_and_seeds_differ() -> None:
    base = RangeDataset(0, 30)
    assert list(base.shuffle()) == list(base.shuffle(seed=0))
    assert list(ShuffledDataset(base)) == list(base.shuffle(seed=0))
    orders = {tuple(base.shuffle(seed)) for seed in range(10)}
    assert len(orders) == 10


def test_shuffle_reads_the_permuted_parent_positions() -> None:
    parent = RangeDataset(0, 40).random_map(_draw, seed=3)
    dataset = parent.shuffle(seed=9)
    indices = np.array([0, 39, 5], dtype=np.int64)
    key = derive_key(KeyPurpose.DATASET_SHUFFLE, 9, 2)
    # The parent is read at the shuffled positions and in the same epoch.
    assert dataset.read(indices, 2) == parent.read(permute(indices, 40, key), 2)


def test_shuffle_over_a_plain_list_and_an_empty_dataset() -> None:
    assert sorted(ShuffledDataset(list("abcde"), seed=1)) == list("abcde")
    empty = ShuffledDataset([], seed=1)
    assert len(empty) == 0
    assert list(empty) == []


def test_transforms_compose() -> None:
    dataset = RangeDataset(0, 20).shuffle(seed=3).map(lambda x: x * 2)
    assert list(dataset) == [x * 2 for x in RangeDataset(0, 20).shuffle(seed=3)]


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_invalid_seed_raises_value_error_naming_it(seed: Any) -> None:
    base = RangeDataset(0, 3)
    with pytest.raises(ValueError, match="seed"):
        base.shuffle(seed)
    with pytest.raises(ValueError, match="seed"):
        ShuffledDataset(base, seed)
    with pytest.raises(ValueError, match="seed"):
        base.random_map(_draw, seed)


# --- Pipeline.read: errors name the record ---------------------------------------------------


class FailsOnIndex:
    """A foreign dataset whose reads fail, batched or not, when they touch `bad`."""

    def __init__(self, size: int, bad: int, error: Exception) -> None:
        self.size, self.bad, self.error = size, bad, error
        self.batched_calls: list[list[int]] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise self.error
        return index

    def __getitems__(self, indices: list[int]) -> list[int]:
        self.batched_calls.append(list(indices))
        if self.bad in indices:
            raise self.error
        return list(indices)


def test_pipeline_read_names_the_failing_record_of_a_map() -> None:
    boom = KeyError("missing field")

    def fn(record: int) -> int:
        if record == 13:
            raise boom
        return record

    pipeline = Pipeline(RangeDataset(10, 20).map(fn), Batcher())
    assert pipeline.read(np.array([0, 1], dtype=np.int64), 0) == [10, 11]
    with pytest.raises(RecordError, match=r"record 3 \(epoch 2\)") as caught:
        pipeline.read(np.array([5, 3, 8], dtype=np.int64), 2)
    assert caught.value.index == 3
    assert caught.value.epoch == 2
    assert caught.value.__cause__ is boom
    assert "KeyError" in str(caught.value)


def test_pipeline_read_names_the_failing_record_when_the_batched_read_fails() -> None:
    boom = OSError("corrupt shard")
    source = FailsOnIndex(size=10, bad=7, error=boom)
    pipeline = Pipeline(source, Batcher())
    with pytest.raises(RecordError, match=r"record 7 \(epoch 4\)") as caught:
        pipeline.read(np.array([2, 7, 9], dtype=np.int64), 4)
    assert caught.value.index == 7
    assert caught.value.epoch == 4
    assert caught.value.__cause__ is boom
    assert source.batched_calls[0] == [2, 7, 9]


def test_pipeline_read_names_the_index_seen_by_the_pipeline_through_a_shuffle() -> None:
    boom = ValueError("bad record")
    n = 16
    pipeline = Pipeline(ShuffledDataset(FailsOnIndex(size=n, bad=0, error=boom), seed=5), Batcher())
    targets = permute(np.arange(n, dtype=np.int64), n, derive_key(KeyPurpose.DATASET_SHUFFLE, 5, 1))
    # The position of the shuffled dataset that maps to the broken parent record 0 in epoch 1.
    position = int(np.flatnonzero(targets == 0)[0])
    with pytest.raises(RecordError, match=rf"record {position} \(epoch 1\)") as caught:
        pipeline.read(np.arange(n, dtype=np.int64), 1)
    assert caught.value.index == position
    assert caught.value.__cause__ is boom


def test_pipeline_read_reraises_a_batch_only_failure_with_a_note() -> None:
    class FailsOnlyInBatches:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            return index

        def __getitems__(self, indices: list[int]) -> list[int]:
            if len(indices) > 1:
                raise OSError("batch too large")
            return list(indices)

    pipeline = Pipeline(FailsOnlyInBatches(), Batcher())
    with pytest.raises(OSError, match="batch too large") as caught:
        pipeline.read(np.array([0, 3], dtype=np.int64), 1)
    assert any("[0, 3]" in note and "epoch 1" in note for note in caught.value.__notes__)
