"""Tests for loadax/polars_source.py: rows of a polars frame, locally and remotely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import table_pipelines
from equivalence import digests, digests_in_every_mode, loader
from helpers import assert_batches_equal, assert_concurrent_reads_are_right, assert_records_equal

from loadax import InMemoryDataset
from loadax.sources.polars import PolarsDataset

RECORDS = 40


def frame(records: int = RECORDS) -> pl.DataFrame:
    data = table_pipelines.columns(records)
    return pl.DataFrame(
        {
            "x": data["x"],
            "label": data["label"],
            "vec": pl.Series(data["vec"], dtype=pl.Array(pl.Float32, 3)),
        }
    )


def test_rows_match_the_frame() -> None:
    dataset = PolarsDataset(frame())
    assert len(dataset) == RECORDS
    assert dataset.columns == ("x", "label", "vec")
    assert_records_equal(list(dataset), table_pipelines.expected_records(RECORDS))
    assert_records_equal([dataset[-1]], table_pipelines.expected_records(RECORDS)[-1:])


def test_a_lazy_frame_is_collected_once() -> None:
    lazy = frame().lazy().filter(pl.col("label") == 3).select("vec", "x")
    dataset = PolarsDataset(lazy)
    assert isinstance(dataset.frame, pl.DataFrame)
    expected = [
        {"vec": record["vec"], "x": record["x"]}
        for record in table_pipelines.expected_records(RECORDS)
        if record["label"] == 3
    ]
    assert len(dataset) == len(expected) == 6
    assert_records_equal(list(dataset), expected)


def test_columns_pick_and_order_the_keys() -> None:
    dataset = PolarsDataset(frame(), columns=["label", "x"])
    assert dataset[5] == {"label": 5, "x": 2.5}
    assert list(dataset[0]) == ["label", "x"]
    assert dataset.frame.columns == ["label", "x"]


def test_getitems_equals_per_index_reads() -> None:
    dataset = PolarsDataset(frame())
    indices = [39, 0, 13, 13, -2, 25]
    batched = dataset.__getitems__(indices)
    assert_records_equal(batched, [dataset[index] for index in indices])
    expected = table_pipelines.expected_records(RECORDS)
    assert_records_equal(batched, [expected[index] for index in indices])
    batched[2]["label"] = -1  # repeated rows are separate dicts
    assert batched[3]["label"] == 6
    with pytest.raises(IndexError, match="index -41 is out of range for PolarsDataset"):
        dataset[-41]


def test_nulls_and_other_types_are_typed_by_the_column_not_the_batch() -> None:
    dataset = PolarsDataset(
        pl.DataFrame(
            {
                "n": pl.Series([None, 1, 2], dtype=pl.Int16),
                "s": ["a", None, "c"],
                "tags": [["p"], [], ["q", "r"]],
            }
        )
    )
    assert dataset.__getitems__([2, 1, 0]) == [
        {"n": 2, "s": "c", "tags": ["q", "r"]},
        {"n": 1, "s": None, "tags": []},
        {"n": None, "s": "a", "tags": ["p"]},
    ]
    assert type(dataset.__getitems__([0, 1])[1]["n"]) is type(dataset[1]["n"]) is np.int16


def test_concurrent_reader_threads_get_the_right_rows() -> None:
    dataset = PolarsDataset(frame())
    expected = table_pipelines.expected_records(RECORDS)
    assert_concurrent_reads_are_right(dataset, expected)


@pytest.mark.parametrize(
    ("frame_argument", "columns", "message"),
    [
        ({"x": [1]}, None, "frame must be a polars.DataFrame or polars.LazyFrame, got dict"),
        (pl.DataFrame({"x": [1]}), ["x", "height"], r"no column 'height'; its columns are \['x'\]"),
        (pl.DataFrame({"x": [1]}), "x", "columns must be a sequence of str"),
        (pl.DataFrame({"x": [1]}), ["x", "x"], "name a column twice"),
        (pl.DataFrame({"x": [1]}), [], "at least one column"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(
    frame_argument: Any, columns: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        PolarsDataset(frame_argument, columns)


def test_a_threaded_loader_gives_the_in_memory_batches() -> None:
    expected = list(loader(InMemoryDataset(table_pipelines.expected_records(RECORDS))))
    assert len(expected) == 2 * 5
    assert_batches_equal(loader(PolarsDataset(frame())), expected)
    assert_batches_equal(loader(PolarsDataset(frame().lazy())), expected)


def test_in_process_and_remote_workers_give_the_local_batches(tmp_path: Path) -> None:
    reference = digests_in_every_mode(tmp_path, "table_pipelines", "polars_rows")
    assert len(reference) == 2 * 5
    in_memory = loader(InMemoryDataset(table_pipelines.expected_records(RECORDS)))
    assert digests(in_memory) == reference
