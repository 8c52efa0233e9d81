"""Tests for loadax/sqlite_source.py: SQLite tables and ordered queries, locally and remotely."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import source_pipelines
from equivalence import digests_in_every_mode, loader
from helpers import assert_batches_equal

from loadax import InMemoryDataset
from loadax.sources.sqlite import SQLiteDataset


def database(tmp_path: Path, *statements: str, rows: Sequence[tuple[Any, ...]] = ()) -> Path:
    """A database file made by `statements`; `rows` go into the first one's `INSERT ... ?`."""
    path = tmp_path / "data.db"
    with sqlite3.connect(path) as connection:
        for statement in statements:
            if "?" in statement:
                connection.executemany(statement, rows)
            else:
                connection.execute(statement)
    connection.close()
    return path


@pytest.fixture
def people(tmp_path: Path) -> Path:
    """Table people: 20 rows with rowids 2, 4, ... then rows 5 and 11 deleted (gaps)."""
    return database(
        tmp_path,
        "CREATE TABLE people (name TEXT, age INTEGER, score REAL, photo BLOB)",
        "INSERT INTO people (rowid, name, age, score, photo) VALUES (?, ?, ?, ?, ?)",
        "DELETE FROM people WHERE age IN (5, 11)",
        rows=[(2 * i + 2, f"p{i}", i, i / 4, bytes([i])) for i in range(20)],
    )


def expected_people() -> list[dict[str, Any]]:
    return [
        {"name": f"p{i}", "age": i, "score": i / 4, "photo": bytes([i])}
        for i in range(20)
        if i not in (5, 11)
    ]


def test_table_rows_come_in_rowid_order_despite_gaps(people: Path) -> None:
    dataset = SQLiteDataset(people, table="people")
    assert len(dataset) == 18
    assert dataset.columns == ("name", "age", "score", "photo")
    assert list(dataset) == expected_people()
    assert dataset[-1] == expected_people()[-1]
    assert dataset[-18] == expected_people()[0]


def test_columns_pick_and_order_the_keys(people: Path) -> None:
    dataset = SQLiteDataset(people, table="people", columns=["score", "name"])
    assert dataset[5] == {"score": 1.5, "name": "p6"}
    assert list(dataset[0]) == ["score", "name"]


def test_getitems_equals_per_index_reads(people: Path) -> None:
    dataset = SQLiteDataset(people, table="people")
    indices = [17, 0, 4, 4, -2, 9]
    batched = dataset.__getitems__(indices)
    assert batched == [dataset[index] for index in indices]
    assert batched == [expected_people()[index] for index in indices]
    batched[2]["age"] = -1  # repeated rows are separate dicts
    assert batched[3]["age"] == 4


def test_out_of_range_indices_raise_index_error(people: Path) -> None:
    dataset = SQLiteDataset(people, table="people")
    for index in (18, -19):
        with pytest.raises(IndexError, match=f"index {index} is out of range for SQLiteDataset"):
            dataset[index]
    with pytest.raises(IndexError):
        dataset.__getitems__([0, 100])


def test_an_ordered_query_is_read_by_position(people: Path) -> None:
    dataset = SQLiteDataset(
        people, query="SELECT name, age * 2 AS twice FROM people WHERE age > 2 ORDER BY age DESC;"
    )
    expected = [{"name": f"p{i}", "twice": 2 * i} for i in range(19, 2, -1) if i not in (5, 11)]
    assert len(dataset) == len(expected)
    assert list(dataset) == expected
    assert dataset.__getitems__([-1, 0, 7, 0]) == [expected[i] for i in (-1, 0, 7, 0)]
    narrowed = SQLiteDataset(people, query="SELECT * FROM people ORDER BY age", columns=["age"])
    assert narrowed.__getitems__([3, 1]) == [{"age": 3}, {"age": 1}]


def test_repeated_query_column_names_get_distinct_keys(people: Path) -> None:
    dataset = SQLiteDataset(people, query="SELECT age, age * 2 AS age FROM people ORDER BY age")
    assert dataset.columns == ("age", "age:1")
    assert dataset[1] == {"age": 1, "age:1": 2}


def test_a_query_without_order_by_is_refused(people: Path) -> None:
    with pytest.raises(ValueError, match=r"query 'SELECT \* FROM people' of .*data\.db.* ORDER BY"):
        SQLiteDataset(people, query="SELECT * FROM people")


def test_a_table_whose_column_is_named_rowid_is_read_by_its_real_rowids(tmp_path: Path) -> None:
    path = database(
        tmp_path,
        "CREATE TABLE t (rowid TEXT, v INTEGER)",
        "INSERT INTO t (_rowid_, rowid, v) VALUES (?, ?, ?)",
        rows=[(10 - i, f"r{i}", i) for i in range(5)],
    )
    assert list(SQLiteDataset(path, table="t")) == [
        {"rowid": f"r{i}", "v": i} for i in range(4, -1, -1)
    ]


def test_identifiers_are_quoted_not_formatted(tmp_path: Path) -> None:
    path = database(
        tmp_path,
        'CREATE TABLE "odd ""name""; x" ("select" INTEGER, "a b" TEXT)',
        'INSERT INTO "odd ""name""; x" VALUES (?, ?)',
        rows=[(1, "one"), (2, "two")],
    )
    dataset = SQLiteDataset(path, table='odd "name"; x', columns=["a b", "select"])
    assert list(dataset) == [{"a b": "one", "select": 1}, {"a b": "two", "select": 2}]
    with pytest.raises(ValueError, match="no such table"):
        SQLiteDataset(path, table='odd "name"; x"; DROP TABLE "odd ""name""; x')
    assert len(SQLiteDataset(path, table='odd "name"; x')) == 2


def test_batches_larger_than_the_parameter_limit_are_read_in_chunks(tmp_path: Path) -> None:
    path = database(
        tmp_path,
        "CREATE TABLE big (v INTEGER)",
        "INSERT INTO big (rowid, v) VALUES (?, ?)",
        rows=[(7 * i, i) for i in range(2500)],
    )
    dataset = SQLiteDataset(path, table="big")
    order = list(range(2500))
    random.Random(0).shuffle(order)
    assert [record["v"] for record in dataset.__getitems__(order)] == order


def test_connections_are_read_only(people: Path) -> None:
    dataset = SQLiteDataset(people, table="people")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        dataset._connections.get().execute("DELETE FROM people")
    assert len(list(dataset)) == 18
    dataset.close()
    assert dataset[0] == expected_people()[0]  # a read after close opens a new connection
    dataset.close()


def test_concurrent_reader_threads_get_the_right_rows(people: Path) -> None:
    dataset = SQLiteDataset(people, table="people")
    query = SQLiteDataset(people, query="SELECT * FROM people ORDER BY age")
    expected = expected_people()

    def read(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(50):
            indices = [rng.randrange(-18, 18) for _ in range(rng.randrange(1, 12))]
            want = [expected[index] for index in indices]
            assert dataset.__getitems__(indices) == want
            assert query.__getitems__(indices) == want

    with ThreadPoolExecutor(8) as pool:
        for outcome in [pool.submit(read, seed) for seed in range(16)]:
            outcome.result()
    assert len(dataset._connections) > 1  # one per thread that read
    dataset.close()
    query.close()


def test_a_missing_file_raises_file_not_found_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.db"):
        SQLiteDataset(tmp_path / "absent.db", table="t")
    assert not (tmp_path / "absent.db").exists()


def test_a_file_that_is_not_a_database_raises_value_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are notes, not a database " * 100)
    with pytest.raises(ValueError, match=r"table 't' of .*notes\.db.*not a database"):
        SQLiteDataset(path, table="t")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"table": "nobody"}, r"table 'nobody' of .*data\.db.*: no such table"),
        ({"table": "people", "columns": ["age", "height"]}, r"table 'people'.*no column 'height'"),
        ({"table": "people", "columns": "age"}, "columns must be a sequence of str"),
        ({"table": "people", "columns": ["age", "age"]}, "name a column twice"),
        ({"query": "SELECT * FROM people ORDER BY age", "columns": ["x"]}, "no column 'x'"),
        ({"query": "SELECT height FROM people ORDER BY age"}, r"data\.db.*no such column: height"),
        ({"query": "SELEC * FROM people ORDER BY age"}, r"query 'SELEC .*syntax error"),
        ({"query": "SELECT * FROM nobody ORDER BY 1"}, "no such table: nobody"),
        ({}, "exactly one of table and query"),
        ({"table": "people", "query": "SELECT 1 ORDER BY 1"}, "exactly one of table and query"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(
    people: Path, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SQLiteDataset(people, **arguments)


def test_views_and_tables_without_rowids_are_refused(people: Path) -> None:
    with sqlite3.connect(people) as connection:
        connection.execute("CREATE VIEW adults AS SELECT * FROM people WHERE age >= 18")
        connection.execute("CREATE TABLE keyed (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID")
    connection.close()
    with pytest.raises(ValueError, match=r"table 'adults'.* is a view"):
        SQLiteDataset(people, table="adults")
    with pytest.raises(ValueError, match=r"table 'keyed'.* has no rowids"):
        SQLiteDataset(people, table="keyed")


def test_a_threaded_loader_gives_the_in_memory_batches(tmp_path: Path) -> None:
    path = source_pipelines.write_sqlite_rows(tmp_path, records=45)
    records = [{"x": i * 0.5, "label": i % 7} for i in range(45)]
    expected = list(loader(InMemoryDataset(records)))
    assert len(expected) == 2 * 6
    assert_batches_equal(loader(SQLiteDataset(path, table="samples")), expected)
    query = SQLiteDataset(path, query="SELECT x, label FROM samples ORDER BY rowid")
    assert_batches_equal(loader(query), expected)


def test_in_process_and_remote_workers_give_the_local_batches(tmp_path: Path) -> None:
    reference = digests_in_every_mode(tmp_path, "source_pipelines", "sqlite_rows")
    assert len(reference) == 2 * 5
    first = next(iter(loader(source_pipelines.sqlite_rows(str(tmp_path / "data")).dataset)))
    assert first["label"].dtype == np.dtype(np.int64)
