"""The DataLoader builder and the Loader it builds."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from loadax import Batcher, DataLoader, InMemoryDataset, RangeDataset

IDENTITY = Batcher(lambda xs: xs)


@pytest.mark.parametrize(
    ("configure", "argument"),
    [
        (lambda d: d.batch_size(0), "batch_size"),
        (lambda d: d.batch_size(-3), "batch_size"),
        (lambda d: d.batch_size(2.0), "batch_size"),
        (lambda d: d.batch_size(True), "batch_size"),
        (lambda d: d.shuffle(seed=-1), "seed"),
        (lambda d: d.shuffle(seed="0"), "seed"),
        (lambda d: d.num_epochs(0), "num_epochs"),
        (lambda d: d.num_epochs(1.5), "num_epochs"),
        (lambda d: d.drop_remainder(1), "drop_remainder"),
        (lambda d: d.workers(-1), "workers"),
        (lambda d: d.workers(None), "workers"),
        (lambda d: d.prefetch(0), "prefetch"),
        (lambda d: d.workers(0).prefetch(2), "prefetch"),
    ],
)
def test_invalid_values_raise_value_error_naming_the_argument(
    configure: Any, argument: str
) -> None:
    with pytest.raises(ValueError, match=argument):
        configure(DataLoader(IDENTITY))


def test_build_without_batch_size_names_it() -> None:
    with pytest.raises(ValueError, match=r"batch_size is required"):
        DataLoader(IDENTITY).build(RangeDataset(0, 3))


def test_the_batcher_must_be_a_batcher() -> None:
    with pytest.raises(ValueError, match=r"batcher must be a loadax\.Batcher"):
        DataLoader(lambda xs: xs)  # type: ignore[arg-type]


def test_a_dataset_with_a_bad_length_is_rejected() -> None:
    class Broken:
        def __len__(self) -> Any:
            return -1

        def __getitem__(self, index: int) -> int:
            return index

    with pytest.raises(ValueError, match="len"):
        DataLoader(IDENTITY).batch_size(2).build(Broken())


def test_something_that_is_not_a_dataset_is_rejected() -> None:
    with pytest.raises(ValueError, match="must have __len__ and __getitem__, got generator"):
        DataLoader(IDENTITY).batch_size(2).build(x for x in range(3))  # type: ignore[arg-type]


def test_builder_methods_return_new_builders() -> None:
    base = DataLoader(IDENTITY).batch_size(2)
    bigger = base.batch_size(5)
    assert len(base.build(RangeDataset(0, 10))) == 5
    assert len(bigger.build(RangeDataset(0, 10))) == 2


@pytest.mark.parametrize(
    ("records", "batch", "epochs", "drop", "length"),
    [
        (10, 3, 1, False, 4),
        (10, 3, 1, True, 3),
        (10, 3, 2, False, 8),
        (2, 3, 4, True, 0),
        (0, 1, 1, False, 0),
    ],
)
def test_len_is_the_number_of_batches_yielded(
    records: int, batch: int, epochs: int, drop: bool, length: int
) -> None:
    loader = (
        DataLoader(IDENTITY)
        .batch_size(batch)
        .num_epochs(epochs)
        .drop_remainder(drop)
        .build(RangeDataset(0, records))
    )
    assert len(loader) == length
    assert len(list(loader)) == length


def test_an_infinite_loader_has_no_len_and_keeps_reshuffling() -> None:
    loader = (
        DataLoader(IDENTITY).batch_size(5).num_epochs(None).shuffle(2).build(RangeDataset(0, 5))
    )
    with pytest.raises(TypeError, match="forever"):
        len(loader)
    iterator = iter(loader)
    epochs = [next(iterator) for _ in range(4)]
    assert all(sorted(epoch) == [0, 1, 2, 3, 4] for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1
    iterator.close()


def test_shuffle_changes_order_but_not_content() -> None:
    plain = [
        x for batch in DataLoader(IDENTITY).batch_size(7).build(RangeDataset(0, 50)) for x in batch
    ]
    shuffled_loader = DataLoader(IDENTITY).batch_size(7).shuffle(seed=1).build(RangeDataset(0, 50))
    shuffled = [x for batch in shuffled_loader for x in batch]
    assert plain == list(range(50))
    assert sorted(shuffled) == plain
    assert shuffled != plain


def test_different_seeds_give_different_orders() -> None:
    def order(seed: int) -> list[int]:
        loader = DataLoader(IDENTITY).batch_size(50).shuffle(seed).build(RangeDataset(0, 50))
        return next(iter(loader))

    assert order(1) == order(1)
    assert order(1) != order(2)


def test_numpy_arrays_and_lists_are_datasets_and_default_batcher_stacks() -> None:
    images = np.arange(24, dtype=np.uint8).reshape(6, 2, 2)
    loader = DataLoader(Batcher()).batch_size(4).build(images)
    first, second = list(loader)
    np.testing.assert_array_equal(first, images[:4])
    np.testing.assert_array_equal(second, images[4:])
    records = [{"a": i, "b": np.full(3, i)} for i in range(4)]
    (batch,) = list(DataLoader(Batcher()).batch_size(4).build(records))
    np.testing.assert_array_equal(batch["a"], [0, 1, 2, 3])
    assert batch["b"].shape == (4, 3)
    wrapped = list(DataLoader(IDENTITY).batch_size(3).build(InMemoryDataset(images)))
    np.testing.assert_array_equal(wrapped[1][2], images[5])


def test_more_workers_than_records_in_a_batch() -> None:
    loader = DataLoader(IDENTITY).batch_size(2).workers(8).build(RangeDataset(0, 5))
    assert list(loader) == [[0, 1], [2, 3], [4]]


def slow_double(x: int) -> int:
    time.sleep(0.05)
    return x * 2


def test_the_readme_workers_example_yields_batches_in_order() -> None:
    dataset = RangeDataset(0, 10).map(slow_double)
    for workers in (1, 2, 5):
        loader = DataLoader(IDENTITY).batch_size(2).workers(workers).build(dataset)
        assert list(loader) == [[0, 2], [4, 6], [8, 10], [12, 14], [16, 18]]
