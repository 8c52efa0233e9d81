"""Tests for loadax/sources/handles.py: one handle per thread, all closed at once, never pickled."""

from __future__ import annotations

import contextlib
import itertools
import pickle
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from loadax.dataset.ops import DatasetBase
from loadax.sources.arrayrecord import ArrayRecordDataset
from loadax.sources.handles import HandlePool
from loadax.sources.parquet import ParquetDataset
from loadax.sources.sqlite import SQLiteDataset

T = TypeVar("T")

_numbers = itertools.count()


class Handle:
    """A stand-in for a connection: which thread opened it, and whether it is closed."""

    def __init__(self) -> None:
        self.number = next(_numbers)
        self.thread = threading.get_ident()
        self.closed = False

    def close(self) -> None:
        assert not self.closed, f"handle {self.number} closed twice"
        self.closed = True


def pool() -> HandlePool[Handle]:
    return HandlePool(Handle, Handle.close)


def in_a_thread(call: Callable[[], T]) -> T:
    """What `call` returns in a new thread, which has finished when this returns."""
    with ThreadPoolExecutor(1) as other:
        return other.submit(call).result()


def test_each_thread_opens_its_own_handle_once_and_reuses_it() -> None:
    handles = pool()
    count = 6
    together = threading.Barrier(count)  # all alive at once, so no two threads share an ident
    seen: dict[int, list[Handle]] = {}

    def read(slot: int) -> None:
        first = handles.get()
        together.wait(timeout=10)
        seen[slot] = [first, handles.get(), handles.get()]

    threads = [threading.Thread(target=read, args=(slot,)) for slot in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(seen) == list(range(count))
    for first, *again in seen.values():
        assert all(handle is first for handle in again)
    firsts = [got[0] for got in seen.values()]
    assert len({handle.number for handle in firsts}) == count
    assert len({handle.thread for handle in firsts}) == count
    assert len(handles) == count
    assert sorted(handle.number for handle in handles.handles()) == sorted(
        handle.number for handle in firsts
    )
    assert not any(handle.closed for handle in firsts)
    handles.close()


def test_close_closes_the_handles_of_every_thread_including_finished_ones() -> None:
    handles = pool()
    finished = in_a_thread(handles.get)
    mine = handles.get()
    with ThreadPoolExecutor(1) as alive:
        living = alive.submit(handles.get).result()
        assert handles.handles() == (finished, mine, living)
        assert not any(handle.closed for handle in (finished, mine, living))
        handles.close()
        assert [handle.closed for handle in (finished, mine, living)] == [True, True, True]
        assert len(handles) == 0
        assert handles.handles() == ()
        handles.close()  # nothing left to close: no handle is closed twice


def test_a_thread_opens_a_new_handle_after_close() -> None:
    handles = pool()
    mine = handles.get()
    with ThreadPoolExecutor(1) as alive:
        before = alive.submit(handles.get).result()
        handles.close()
        after = alive.submit(handles.get).result()
        assert after is not before
        assert not after.closed
        assert alive.submit(handles.get).result() is after
    again = handles.get()
    assert again is not mine
    assert not again.closed
    assert handles.handles() == (after, again)
    handles.close()
    assert after.closed
    assert again.closed


def test_a_failed_open_leaves_nothing_behind_and_the_next_get_retries() -> None:
    attempts: list[int] = []

    def open_second_time() -> Handle:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("cannot open")
        return Handle()

    handles = HandlePool(open_second_time, Handle.close)
    with pytest.raises(OSError, match="cannot open"):
        handles.get()
    assert len(handles) == 0
    handle = handles.get()
    assert handles.handles() == (handle,)
    assert len(attempts) == 2
    handles.close()


def test_a_pickled_pool_arrives_empty_and_opens_its_own() -> None:
    handles = pool()
    mine, other = handles.get(), in_a_thread(handles.get)
    copy = pickle.loads(pickle.dumps(handles))
    assert len(copy) == 0
    fresh = copy.get()
    assert fresh is not mine
    assert copy.get() is fresh
    assert handles.handles() == (mine, other)  # the original keeps its handles, open
    assert not mine.closed
    assert not other.closed
    copy.close()
    assert fresh.closed
    assert not mine.closed
    handles.close()


def _sqlite(tmp_path: Path) -> tuple[DatasetBase[Any], str]:
    path = tmp_path / "rows.db"
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("CREATE TABLE t (id INTEGER)")
        connection.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    return SQLiteDataset(path, table="t"), "_connections"


def _parquet(tmp_path: Path) -> tuple[DatasetBase[Any], str]:
    pq.write_table(pa.table({"id": np.arange(10)}), tmp_path / "rows.parquet", row_group_size=3)
    return ParquetDataset(tmp_path / "rows.parquet"), "_states"


def _arrayrecord(tmp_path: Path) -> tuple[DatasetBase[Any], str]:
    path = tmp_path / "rows.array_record"
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for index in range(10):
        writer.write(str(index).encode())
    writer.close()
    return ArrayRecordDataset(path, decode=_record), "_readers"


def _record(data: bytes) -> dict[str, int]:
    return {"id": int(data)}


@pytest.mark.parametrize("make", [_sqlite, _parquet, _arrayrecord])
def test_a_pickled_source_opens_its_own_handles_and_the_original_keeps_reading(
    tmp_path: Path, make: Callable[[Path], tuple[DatasetBase[Any], str]]
) -> None:
    dataset, name = make(tmp_path)
    assert int(dataset[3]["id"]) == 3
    assert int(in_a_thread(lambda: dataset[7])["id"]) == 7
    handles: HandlePool[Any] = getattr(dataset, name)
    opened = handles.handles()
    assert len(opened) == 2  # open in two threads, one of them finished, when pickled
    copy = pickle.loads(pickle.dumps(dataset))
    copied: HandlePool[Any] = getattr(copy, name)
    assert [int(record["id"]) for record in copy] == list(range(10))
    assert len(copied) == 1  # this thread's, opened by the copy (SQLite's while it was made)
    assert not any(handle is theirs for handle in copied.handles() for theirs in opened)
    assert int(dataset[9]["id"]) == 9
    assert handles.handles() == opened  # the original reads on with its own
    dataset.close()
    assert len(handles) == 0
    assert len(copied) == 1  # closing the original leaves the copy's open
    assert int(copy[4]["id"]) == 4
    copy.close()
    assert len(copied) == 0
