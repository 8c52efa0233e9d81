"""Checked by mypy in tests/test_typing.py: the item type flows through the Batcher to batches."""

from typing import assert_type

import numpy as np
import numpy.typing as npt

from loadax import Batcher, DataLoader, InMemoryDataset, RangeDataset

summed = DataLoader(Batcher(lambda xs: sum(xs))).batch_size(2).build(RangeDataset(0, 10))
for total in summed:
    assert_type(total, int)


def to_array(records: list[int]) -> npt.NDArray[np.int64]:
    return np.asarray(records, dtype=np.int64)


arrays = DataLoader(Batcher(to_array)).batch_size(2).build(RangeDataset(0, 10))
for array in arrays:
    assert_type(array, npt.NDArray[np.int64])


def join(records: list[str]) -> str:
    return "".join(records)


words = DataLoader(Batcher(join)).batch_size(2).workers(0).build(InMemoryDataset(["a", "b"]))
for word in words:
    assert_type(word, str)

mapped = RangeDataset(0, 3).map(str).map(len)
assert_type(mapped[0], int)

sliced = RangeDataset(0, 5).slice(1, 3)
assert_type(sliced[0], int)
joined = RangeDataset(0, 3).concatenate(RangeDataset(5, 7), [9]).map(str)
assert_type(joined[0], str)
