"""An SQLite table or ordered query as a dataset: record i is row i, a column -> value dict."""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.columns import check_columns, choose_columns
from loadax.sources.handles import HandlePool

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_MAX_PARAMETERS = 999  # SQLite's smallest SQLITE_MAX_VARIABLE_NUMBER across versions


class SQLiteDataset(DatasetBase[dict[str, Any]]):
    """The rows of `table` (in rowid order) or of `query` (which must ORDER BY a unique key).

    `columns` picks the columns of each record (default: all). The file is opened read-only,
    with one connection per reading thread, and must not change while it is read. A table is
    read by rowid: its sorted rowids are loaded once (8 bytes a row), and each batch is one
    `WHERE rowid IN (...)` query. A query has no rowids, so a batch scans the query's result
    from its first to its last position: fine for small results or sequential reads; to shuffle a
    large query, store its result as a table.

    >>> import contextlib
    >>> import pathlib
    >>> import sqlite3
    >>> import tempfile
    >>> from loadax import SQLiteDataset
    >>> directory = tempfile.TemporaryDirectory()
    >>> path = pathlib.Path(directory.name) / "rows.db"
    >>> with contextlib.closing(sqlite3.connect(path)) as connection, connection:
    ...     _ = connection.execute("CREATE TABLE t (id INTEGER, name TEXT)")
    ...     _ = connection.executemany("INSERT INTO t VALUES (?, ?)", [(1, "a"), (2, "b")])
    >>> table = SQLiteDataset(path, table="t")
    >>> len(table), table[1]
    (2, {'id': 2, 'name': 'b'})
    >>> query = SQLiteDataset(path, query="SELECT name FROM t ORDER BY id DESC")
    >>> list(query)
    [{'name': 'b'}, {'name': 'a'}]
    >>> table.close()
    >>> query.close()
    >>> directory.cleanup()
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        table: str | None = None,
        query: str | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        self._path = Path(path)
        if not self._path.is_file():
            raise FileNotFoundError(f"SQLiteDataset: no SQLite file at {str(self._path)!r}")
        if (table is None) == (query is None):
            raise ValueError("SQLiteDataset: give exactly one of table and query")
        check_columns(columns, "SQLiteDataset")
        uri = self._path.resolve().as_uri() + "?mode=ro"
        self._connections = HandlePool(partial(_connect, uri), sqlite3.Connection.close)
        self._table, self._query = table, query
        try:
            if table is not None:
                self._init_table(table, columns)
            elif query is not None:
                self._init_query(query, columns)
        except sqlite3.Error as error:
            self.close()
            raise ValueError(f"SQLiteDataset: cannot read {self._where()}: {error}") from None
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return self._length

    @property
    def columns(self) -> tuple[str, ...]:
        """The keys of every record, in order."""
        return self._columns

    def read(self, indices: IndexArray, epoch: int) -> list[dict[str, Any]]:
        if indices.size == 0:
            return []
        try:
            if self._rowids is not None:
                return self._read_rowids(self._rowids[indices])
            return self._read_positions(indices)
        except sqlite3.Error as error:
            raise ValueError(f"SQLiteDataset: cannot read {self._where()}: {error}") from None

    def close(self) -> None:
        """Close every thread's connection; a later read opens new ones."""
        self._connections.close()

    def __repr__(self) -> str:
        source = f"table={self._table!r}" if self._table is not None else f"query={self._query!r}"
        return f"SQLiteDataset({str(self._path)!r}, {source}, columns={list(self._columns)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path (for loader processes): unpickling opens the file again.
        return (type(self), (self._path.absolute(), self._table, self._query, self._columns))

    def _init_table(self, table: str, columns: Sequence[str] | None) -> None:
        connection = self._connections.get()
        found = connection.execute(
            "SELECT type FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (table,)
        ).fetchone()
        if found is None:
            raise ValueError(f"SQLiteDataset: {self._where()}: no such table")
        if found[0] == "view":
            raise ValueError(
                f"SQLiteDataset: {self._where()} is a view, which has no rowids; "
                "read it with query='SELECT ... ORDER BY ...'"
            )
        names = [
            row[0] for row in connection.execute("SELECT name FROM pragma_table_info(?)", (table,))
        ]
        self._columns = choose_columns(columns, names, source="SQLiteDataset", table=self._where())
        lowered = {name.lower() for name in names}
        # A column may be named rowid; SQLite's other names for the rowid may still be free.
        rowid = next((alias for alias in ("rowid", "_rowid_", "oid") if alias not in lowered), None)
        if rowid is None:
            raise ValueError(
                f"SQLiteDataset: {self._where()} has columns named rowid, _rowid_ and oid, "
                "which hide its rowids; read it with query='SELECT ... ORDER BY ...'"
            )
        quoted = _quote(table)
        self._select = f"SELECT {rowid}, {', '.join(map(_quote, self._columns))} FROM {quoted}"
        self._rowid_name = rowid
        try:
            # One read transaction, so the count and the rowids agree.
            connection.execute("BEGIN")
            (count,) = connection.execute(f"SELECT COUNT(*) FROM {quoted}").fetchone()
            cursor = connection.execute(f"SELECT {rowid} FROM {quoted} ORDER BY {rowid}")
            rowids = np.fromiter((row[0] for row in cursor), dtype=np.int64, count=count)
        except sqlite3.OperationalError as error:
            if "no such column" in str(error):
                raise ValueError(
                    f"SQLiteDataset: {self._where()} has no rowids (WITHOUT ROWID); "
                    "read it with query='SELECT ... ORDER BY ...'"
                ) from None
            raise
        finally:
            connection.rollback()
        self._rowids: np.ndarray[Any, np.dtype[np.int64]] | None = rowids
        self._length = int(count)

    def _init_query(self, query: str, columns: Sequence[str] | None) -> None:
        query = query.strip().rstrip(";").strip()
        self._query = query
        if not _ORDER_BY.search(query):
            raise ValueError(
                f"SQLiteDataset: {self._where()} has no ORDER BY; without one SQLite may return "
                "its rows in any order, and positions would not name the same rows every time"
            )
        connection = self._connections.get()
        names = [
            item[0] for item in connection.execute(f"SELECT * FROM ({query}) LIMIT 0").description
        ]
        # SQLite names repeated result columns apart ("id", "id:1"), so keys never collide.
        self._columns = choose_columns(columns, names, source="SQLiteDataset", table=self._where())
        self._select = f"SELECT {', '.join(map(_quote, self._columns))} FROM ({query})"
        (count,) = connection.execute(f"SELECT COUNT(*) FROM ({query})").fetchone()
        self._rowids = None
        self._length = int(count)

    def _read_rowids(self, rowids: np.ndarray[Any, np.dtype[np.int64]]) -> list[dict[str, Any]]:
        connection = self._connections.get()
        wanted = np.unique(rowids).tolist()
        rows: dict[int, dict[str, Any]] = {}
        for start in range(0, len(wanted), _MAX_PARAMETERS):
            chunk = wanted[start : start + _MAX_PARAMETERS]
            marks = ", ".join("?" * len(chunk))
            query = f"{self._select} WHERE {self._rowid_name} IN ({marks})"
            for rowid, *values in connection.execute(query, chunk):
                rows[rowid] = dict(zip(self._columns, values, strict=True))
        missing = [rowid for rowid in wanted if rowid not in rows]
        if missing:
            raise ValueError(
                f"SQLiteDataset: rows with rowid {missing[:5]} of {self._where()} are gone: "
                "the file changed while it was being read"
            )
        return [dict(rows[rowid]) for rowid in rowids.tolist()]

    def _read_positions(self, indices: IndexArray) -> list[dict[str, Any]]:
        first, last = int(indices.min()), int(indices.max())
        wanted = set(indices.tolist())
        rows: dict[int, dict[str, Any]] = {}
        cursor = self._connections.get().execute(
            f"{self._select} LIMIT ? OFFSET ?", (last - first + 1, first)
        )
        for position, values in enumerate(cursor, start=first):
            if position in wanted:
                rows[position] = dict(zip(self._columns, values, strict=True))
        if len(rows) != len(wanted):
            raise ValueError(
                f"SQLiteDataset: {self._where()} returned fewer rows than its count: "
                "the file changed while it was being read"
            )
        return [dict(rows[position]) for position in indices.tolist()]

    def _where(self) -> str:
        if self._table is not None:
            return f"table {self._table!r} of {str(self._path)!r}"
        return f"query {self._query!r} of {str(self._path)!r}"


def _connect(uri: str) -> sqlite3.Connection:
    # isolation_level=None: reads run in autocommit; _init_table begins its own transaction.
    return sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)


def _quote(identifier: str) -> str:
    """`identifier` as an SQL quoted identifier; only names read from the schema reach here."""
    return '"' + identifier.replace('"', '""') + '"'
