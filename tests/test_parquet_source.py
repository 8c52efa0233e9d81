"""Tests for loadax/parquet_source.py: Parquet files read by row group, locally and remotely."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
import table_pipelines
from equivalence import digests_in_every_mode, loader
from helpers import assert_batches_equal, assert_concurrent_reads_are_right, assert_records_equal

from loadax import InMemoryDataset
from loadax.sources.parquet import ParquetDataset

RECORDS = 40


class CountingParquetDataset(ParquetDataset):
    """Counts the row groups it decodes, by (file, row group)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoded: Counter[tuple[int, int]] = Counter()

    def _read_row_group(self, file: int, group: int) -> Any:
        self.decoded[file, group] += 1
        return super()._read_row_group(file, group)


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    """40 rows over 3 files (13, 13, 14 rows), in row groups of 4: 12 row groups."""
    return table_pipelines.write_parquet_rows(tmp_path, RECORDS)


def test_rows_match_the_table_across_files_in_order(files: list[Path]) -> None:
    dataset = ParquetDataset(files)
    assert len(dataset) == RECORDS
    assert dataset.paths == tuple(files)
    assert dataset.columns == ("x", "label", "vec")
    assert_records_equal(list(dataset), table_pipelines.expected_records(RECORDS))
    assert_records_equal([dataset[-1]], table_pipelines.expected_records(RECORDS)[-1:])
    reversed_order = ParquetDataset(files[::-1])
    assert_records_equal([reversed_order[0]], [table_pipelines.expected_records(RECORDS)[26]])


def test_one_path_and_column_selection(files: list[Path]) -> None:
    dataset = ParquetDataset(str(files[1]), columns=["vec", "label"])
    assert len(dataset) == 13
    assert list(dataset[0]) == ["vec", "label"]
    assert_records_equal(
        [dataset[2]], [{"vec": np.array([15, 16, 17], np.float32), "label": np.int64(1)}]
    )


def test_getitems_equals_per_index_reads(files: list[Path]) -> None:
    dataset = ParquetDataset(files)
    indices = [39, 0, 13, 13, -2, 25, 26, 12]
    batched = dataset.__getitems__(indices)
    assert_records_equal(batched, [dataset[index] for index in indices])
    expected = table_pipelines.expected_records(RECORDS)
    assert_records_equal(batched, [expected[index] for index in indices])
    batched[2]["label"] = -1  # repeated rows are separate dicts
    assert batched[3]["label"] == 6
    with pytest.raises(IndexError, match="index 40 is out of range for ParquetDataset"):
        dataset[40]


def test_shuffled_reads_decode_each_row_group_once_per_call(files: list[Path]) -> None:
    dataset = CountingParquetDataset(files, columns=["label"])
    every = list(range(RECORDS))
    random.Random(0).shuffle(every)
    assert [record["label"] for record in dataset.__getitems__(every)] == [i % 7 for i in every]
    assert len(dataset.decoded) == 12
    assert set(dataset.decoded.values()) == {1}
    for seed in range(5):
        dataset.decoded.clear()
        indices = random.Random(seed).sample(range(RECORDS), 15)
        assert [record["label"] for record in dataset.__getitems__(indices)] == [
            i % 7 for i in indices
        ]
        assert set(dataset.decoded.values()) <= {1}


def test_sequential_reads_decode_each_row_group_once(files: list[Path]) -> None:
    dataset = CountingParquetDataset(files)
    for start in range(0, RECORDS, 3):
        dataset.__getitems__(list(range(start, min(start + 3, RECORDS))))
    assert len(dataset.decoded) == 12
    assert set(dataset.decoded.values()) == {1}


def test_only_the_selected_columns_are_decoded(files: list[Path]) -> None:
    tables: list[Any] = []

    class Recording(ParquetDataset):
        def _read_row_group(self, file: int, group: int) -> Any:
            tables.append(super()._read_row_group(file, group))
            return tables[-1]

    Recording(files, columns=["x"])[20]
    assert [table.column_names for table in tables] == [["x"]]


def test_nulls_and_other_types_are_typed_by_the_column_not_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "mixed.parquet"
    table = pa.table(
        {
            "n": pa.array([None, 1, 2, None], pa.int16()),
            "s": ["a", "b", None, "d"],
            "flag": [True, False, True, False],
        }
    )
    pq.write_table(table, path, row_group_size=2)
    dataset = ParquetDataset(path)
    assert dataset.__getitems__([1, 2]) == [
        {"n": 1, "s": "b", "flag": False},
        {"n": 2, "s": None, "flag": True},
    ]
    together = dataset.__getitems__([0, 1])
    alone = dataset.__getitems__([1])
    assert together[0]["n"] is None
    assert type(together[1]["n"]) is type(alone[0]["n"]) is np.int16
    assert type(alone[0]["flag"]) is np.bool_


def test_concurrent_reader_threads_get_the_right_rows(files: list[Path]) -> None:
    dataset = ParquetDataset(files)
    expected = table_pipelines.expected_records(RECORDS)
    assert_concurrent_reads_are_right(dataset, expected)
    assert len(dataset._states) > 1  # one cache per thread that read
    dataset.close()
    assert_records_equal([dataset[5]], [expected[5]])  # a read after close reopens the file
    dataset.close()


def test_a_missing_file_or_a_directory_is_refused_naming_it(
    tmp_path: Path, files: list[Path]
) -> None:
    with pytest.raises(FileNotFoundError, match=r"no Parquet file at .*absent\.parquet"):
        ParquetDataset([files[0], tmp_path / "absent.parquet"])
    with pytest.raises(ValueError, match=r"is a directory; pass its files"):
        ParquetDataset(tmp_path)


def test_a_file_that_is_not_parquet_raises_value_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.parquet"
    path.write_text("these are notes, not a table " * 100)
    with pytest.raises(ValueError, match=r"notes\.parquet.* is not a readable Parquet file"):
        ParquetDataset(path)


def test_files_whose_selected_columns_differ_are_refused(tmp_path: Path, files: list[Path]) -> None:
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": pa.array([1.0], pa.float64()), "label": [3]}), other)
    with pytest.raises(ValueError, match=r"column 'x' is double in .*other\.parquet.* but float"):
        ParquetDataset([files[0], other])
    with pytest.raises(ValueError, match=r"other\.parquet.* has no column 'vec'"):
        ParquetDataset([files[0], other], columns=["label", "vec"])
    dataset = ParquetDataset([files[0], other], columns=["label"])  # agreeing columns suffice
    assert [record["label"] for record in dataset] == [i % 7 for i in range(13)] + [3]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"columns": ["x", "height"]}, r"rows-0\.parquet.* has no column 'height'"),
        ({"columns": "x"}, "columns must be a sequence of str"),
        ({"columns": ["x", "x"]}, "name a column twice"),
        ({"columns": []}, "at least one column"),
    ],
)
def test_bad_columns_raise_value_error_naming_them(
    files: list[Path], arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ParquetDataset(files, **arguments)


def test_bad_paths_raise_value_error() -> None:
    with pytest.raises(ValueError, match="paths must not be empty"):
        ParquetDataset([])
    with pytest.raises(ValueError, match=r"paths must be str or os\.PathLike"):
        ParquetDataset([3])  # type: ignore[list-item]


def test_a_threaded_loader_gives_the_in_memory_batches(files: list[Path]) -> None:
    expected = list(loader(InMemoryDataset(table_pipelines.expected_records(RECORDS))))
    assert len(expected) == 2 * 5
    assert_batches_equal(loader(ParquetDataset(files)), expected)


def test_in_process_and_remote_workers_give_the_local_batches(tmp_path: Path) -> None:
    reference = digests_in_every_mode(tmp_path, "table_pipelines", "parquet_rows")
    assert len(reference) == 2 * 5


def test_many_files_are_read_with_a_bounded_number_open(tmp_path: Path) -> None:
    paths = []
    for number in range(12):
        paths.append(tmp_path / f"part-{number:02}.parquet")
        pq.write_table(pa.table({"v": [2 * number, 2 * number + 1]}), paths[-1])
    dataset = ParquetDataset(paths)
    order = list(range(24))
    random.Random(1).shuffle(order)
    assert [record["v"] for record in dataset.__getitems__(order)] == order
    (state,) = dataset._states.handles()
    assert len(state.files) == 8
    assert len(state.groups) == 2
    dataset.close()
