"""Tests for loadax/numpy_source.py: rows of a memory-mapped .npy file, locally and remotely."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import source_pipelines
from equivalence import digests_in_every_mode, loader
from helpers import assert_batches_equal

from loadax import InMemoryDataset
from loadax.sources.numpy import NumpyDataset


def saved(tmp_path: Path, array: np.ndarray[Any, Any], name: str = "data.npy") -> Path:
    path = tmp_path / name
    np.save(path, array, allow_pickle=True)
    return path


@pytest.mark.parametrize("mmap", [True, False])
def test_rows_match_the_array(tmp_path: Path, mmap: bool) -> None:
    array = np.arange(30, dtype=np.float32).reshape(10, 3)
    dataset = NumpyDataset(saved(tmp_path, array), mmap=mmap)
    assert len(dataset) == 10
    for index, row in enumerate(dataset):
        assert row.dtype == np.float32
        np.testing.assert_array_equal(row, array[index])
    np.testing.assert_array_equal(dataset[-1], array[9])
    np.testing.assert_array_equal(dataset[-10], array[0])


def test_a_one_dimensional_file_gives_numpy_scalars(tmp_path: Path) -> None:
    dataset = NumpyDataset(saved(tmp_path, np.array([7, 8, 9], dtype=np.int16)))
    records = dataset.__getitems__([2, 0, -1])
    assert [int(r) for r in records] == [9, 7, 9]
    assert all(isinstance(r, np.int16) for r in records)


def test_structured_and_multidimensional_rows(tmp_path: Path) -> None:
    images = np.arange(4 * 2 * 2 * 3, dtype=np.uint8).reshape(4, 2, 2, 3)
    np.testing.assert_array_equal(NumpyDataset(saved(tmp_path, images))[2], images[2])
    table = np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")])
    record = NumpyDataset(saved(tmp_path, table, "table.npy"))[1]
    assert (int(record["a"]), float(record["b"])) == (3, 4.5)


def test_getitems_equals_per_index_reads(tmp_path: Path) -> None:
    array = np.random.default_rng(1).random((50, 4))
    dataset = NumpyDataset(saved(tmp_path, array))
    indices = [49, 0, 7, 7, -3, 12]
    batched = dataset.__getitems__(indices)
    assert len(batched) == len(indices)
    for got, index in zip(batched, indices, strict=True):
        np.testing.assert_array_equal(got, dataset[index])
        np.testing.assert_array_equal(got, array[index])


def test_out_of_range_and_non_int_indices_raise(tmp_path: Path) -> None:
    dataset = NumpyDataset(saved(tmp_path, np.zeros((3, 2))))
    for index in (3, -4):
        with pytest.raises(IndexError, match=f"index {index} is out of range for NumpyDataset"):
            dataset[index]
    with pytest.raises(IndexError):
        dataset.__getitems__([0, 5])
    with pytest.raises(TypeError, match="indices must be ints"):
        dataset[1.0]  # type: ignore[index]


def test_an_empty_array_is_an_empty_dataset(tmp_path: Path) -> None:
    dataset = NumpyDataset(saved(tmp_path, np.zeros((0, 3), dtype=np.float32)))
    assert len(dataset) == 0
    assert list(dataset) == []


def test_a_missing_file_raises_file_not_found_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.npy"
    with pytest.raises(FileNotFoundError, match=r"absent\.npy"):
        NumpyDataset(path)


def test_a_file_that_is_not_npy_raises_value_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "text.npy"
    path.write_text("not an array at all")
    with pytest.raises(ValueError, match=r"text\.npy.* is not a valid \.npy file"):
        NumpyDataset(path)


def test_an_npz_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "arrays.npz"
    np.savez(path, x=np.zeros(3))
    assert zipfile.is_zipfile(path)
    with pytest.raises(ValueError, match=r"arrays\.npz.* is not a valid \.npy file"):
        NumpyDataset(path)


@pytest.mark.parametrize("mmap", [True, False])
def test_a_truncated_file_raises_value_error_naming_it(tmp_path: Path, mmap: bool) -> None:
    path = saved(tmp_path, np.arange(1000, dtype=np.int64))
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"cannot read .*data\.npy"):
        NumpyDataset(path, mmap=mmap)


def test_a_zero_dimensional_array_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.npy.* holds a 0-d array"):
        NumpyDataset(saved(tmp_path, np.array(5.0)))


@pytest.mark.parametrize("mmap", [True, False])
def test_an_object_array_is_refused_without_unpickling(tmp_path: Path, mmap: bool) -> None:
    path = saved(tmp_path, np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match=r"data\.npy.* holds an object array .* pickle"):
        NumpyDataset(path, mmap=mmap)


def test_mmap_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mmap must be a bool"):
        NumpyDataset(saved(tmp_path, np.zeros(3)), mmap=1)  # type: ignore[arg-type]


def test_transforms_chain(tmp_path: Path) -> None:
    dataset = NumpyDataset(saved(tmp_path, np.arange(5))).map(lambda x: int(x) * 10)
    assert list(dataset) == [0, 10, 20, 30, 40]


def test_a_threaded_loader_gives_the_in_memory_batches(tmp_path: Path) -> None:
    path = source_pipelines.write_numpy_rows(tmp_path, records=45)
    expected = list(loader(InMemoryDataset(np.load(path))))
    assert len(expected) == 2 * 6
    assert_batches_equal(loader(NumpyDataset(path)), expected)


def test_in_process_and_remote_workers_give_the_local_batches(tmp_path: Path) -> None:
    reference = digests_in_every_mode(tmp_path, "source_pipelines", "numpy_rows")
    assert len(reference) == 2 * 5
