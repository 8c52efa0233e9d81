"""Parquet files as a dataset: record i is row i across the files, read by row group, from local
disk or an object store (`s3://`, `gs://`, or a given filesystem)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.columns import check_columns, choose_columns
from loadax.sources.filesystems import Store, store_of
from loadax.sources.handles import HandlePool
from loadax.sources.paths import listed_paths
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy
from loadax.sources.storage_errors import Location

_CACHED_GROUPS = 2  # decoded row groups kept per reading thread
_OPEN_FILES = 8  # open files kept per reading thread


class ParquetDataset(DatasetBase[dict[str, Any]]):
    """The rows of the Parquet file at `paths`, or of each file of `paths` in turn.

    Give files, not directories: a directory is refused rather than globbed, so the order of the
    rows never depends on a listing (pass `sorted(Path(d).glob("*.parquet"))`). `columns` picks
    the columns of each record (default: all of the first file's); every file must hold them with
    the same types. Numeric and boolean values without nulls are numpy scalars of the column's
    dtype, fixed-size lists of them are numpy arrays, and everything else is the Python value
    `to_pylist` gives. The row counts of the row groups are read from the footers once. A batch
    decodes each row group it touches once, with only the selected columns, and never a whole
    file; each reading thread keeps its last 2 decoded row groups, so sequential reads decode each
    group once, and up to 8 files open. The files must not change while they are read.

    Objects in a store are read the same way: `paths` may be URLs (`s3://bucket/key.parquet`,
    `gs://bucket/key.parquet`) or globs of them (`s3://bucket/train/*.parquet`: `*`, `?` and
    `[...]` within a name, `**` across prefixes; matches in sorted order), made into a pyarrow
    filesystem by `pyarrow.fs.FileSystem.from_uri` (credentials from the environment; the URL's
    query, e.g. `?endpoint_override=host:port&scheme=http`, sets its options). With `filesystem`
    (a `pyarrow.fs.FileSystem`, such as `S3FileSystem(...)`, or an fsspec filesystem) the paths
    and globs are paths in it. Nothing reads a whole object: a file's footer is read once per
    reading thread, and a batch fetches only the selected columns of the row groups it touches,
    by ranged requests (pyarrow's pre-buffering joins a row group's column chunks into requests
    of at most 32 MiB). Each reading thread has its own copy of the filesystem and its own open
    files. A missing object or bucket is a FileNotFoundError, refused credentials a
    PermissionError, each naming the URL and what to check, and each a `loadax.StorageError`.
    A read of records that meets an outage (the store unreachable, throttling, timing out or
    answering 5xx) is retried with back-off under `retries` (by default for up to a minute),
    each retry logged as a warning; then, or at once for a refusal, the StorageError reaches the
    training loop as itself, not as a bad record. Making the dataset (listing, footers) is not
    retried: an unreachable store then is most often a wrong endpoint. Pickled (for loader
    processes), the dataset carries the URLs, the filesystem's options and `retries`, and opens
    its files again.

    >>> import pathlib
    >>> import tempfile
    >>> import pyarrow as pa
    >>> import pyarrow.parquet as pq
    >>> from loadax.sources.parquet import ParquetDataset
    >>> directory = tempfile.TemporaryDirectory()
    >>> path = pathlib.Path(directory.name) / "rows.parquet"
    >>> pq.write_table(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}), path)
    >>> dataset = ParquetDataset(path)
    >>> record = dataset[2]
    >>> len(dataset), dataset.columns, record["name"], record["id"].dtype
    (3, ('id', 'name'), 'c', dtype('int64'))
    >>> dataset.close()
    >>> directory.cleanup()
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        filesystem: Any = None,
        retries: RetryPolicy = DEFAULT_RETRIES,
    ) -> None:
        chosen = tuple(listed_paths(paths, "ParquetDataset"))
        found = store_of(chosen, filesystem, "ParquetDataset", retries=retries)
        self._store: Store | None = None if found is None else found[0]
        # The files in row order: local Paths, or the objects of the store (and their URLs).
        self._objects: tuple[Location, ...] = () if found is None else tuple(found[1])
        self._paths: tuple[Path | str, ...] = (
            tuple(Path(path) for path in chosen)
            if found is None
            else tuple(location.shown for location in self._objects)
        )
        check_columns(columns, "ParquetDataset")
        if columns is not None and not columns:
            raise ValueError("ParquetDataset: columns must name at least one column")
        self._columns: tuple[str, ...] = ()
        counts: list[int] = []
        files: list[int] = []
        first_types: dict[str, Any] = {}
        opening = None if self._store is None else self._store.filesystem
        for position, path in enumerate(self._paths):
            handle = self._open(position, opening)
            try:
                schema = handle.schema_arrow
                if position == 0:
                    self._columns = choose_columns(
                        columns, schema.names, source="ParquetDataset", table=repr(str(path))
                    )
                    first_types = {name: schema.field(name).type for name in self._columns}
                else:
                    _check_schema(path, schema, first_types, self._paths[0])
                metadata = handle.metadata
                for group in range(metadata.num_row_groups):
                    counts.append(int(metadata.row_group(group).num_rows))
                    files.append(position)
            finally:
                handle.close()
        sizes = np.array(counts, dtype=np.int64)
        # Global row group g holds rows [_starts[g], _ends[g]) and is group _locals[g] of file
        # _files[g]; memory is a few ints per row group, whatever the number of rows.
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        self._files = np.array(files, dtype=np.int64)
        first_of_file = np.searchsorted(self._files, self._files, side="left")
        self._locals = np.arange(len(files), dtype=np.int64) - first_of_file
        self._states = HandlePool(partial(_ThreadState, self._store), _ThreadState.close)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def paths(self) -> tuple[Path | str, ...]:
        """The files, in the order their rows are numbered: Paths, or the objects' URLs (str)."""
        return self._paths

    @property
    def columns(self) -> tuple[str, ...]:
        """The keys of every record, in order."""
        return self._columns

    def read(self, indices: IndexArray, epoch: int) -> list[dict[str, Any]]:
        if indices.size == 0:
            return []
        # Sorted, the rows of each row group are contiguous: decode each group once, in file order.
        order = np.argsort(indices, kind="stable")
        groups = np.searchsorted(self._ends, indices[order], side="right")
        rows = indices[order] - self._starts[groups]
        unique, firsts = np.unique(groups, return_index=True)
        values: list[list[Any]] = [[] for _ in self._columns]
        for group, chunk in zip(unique.tolist(), np.split(rows, firsts[1:]), strict=True):
            taken = self._row_group(group).take(pa.array(chunk))
            for column, name in zip(values, self._columns, strict=True):
                column.extend(_values(taken.column(name)))
        grouped = list(zip(*values, strict=True))
        records: list[dict[str, Any]] = [{} for _ in range(len(order))]
        for position, row in zip(order.tolist(), grouped, strict=True):
            records[position] = dict(zip(self._columns, row, strict=True))
        return records

    def close(self) -> None:
        """Close every thread's files and drop its cached row groups; later reads reopen them."""
        self._states.close()

    def __repr__(self) -> str:
        shown = [str(path) for path in self._paths]
        return f"ParquetDataset({shown!r}, columns={list(self._columns)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path or URL (for loader processes): unpickling reads the footers again.
        columns = self._columns or None  # None: a file without columns
        if self._store is None:
            paths = [Path(path).absolute() for path in self._paths]
            return (type(self), (paths, columns))
        # Globs expanded (a listing now may differ), and the filesystem by its options.
        objects = [location.path for location in self._objects]
        return (type(self), (objects, columns, self._store.user_filesystem, self._store.retries))

    def _row_group(self, group: int) -> Any:
        """Row group `group` (global numbering) with the selected columns, decoded or cached."""
        state = self._states.get()
        table = state.groups.get(group)
        if table is None:
            file, local = int(self._files[group]), int(self._locals[group])
            table = self._read_row_group(file, local)
            expected = int(self._ends[group] - self._starts[group])
            if table.num_rows != expected:
                raise ValueError(
                    f"ParquetDataset: row group {local} of {str(self._paths[file])!r} has "
                    f"{table.num_rows} rows, not {expected}: the file changed while it was read"
                )
            state.groups[group] = table
            if len(state.groups) > _CACHED_GROUPS:
                state.groups.popitem(last=False)
        else:
            state.groups.move_to_end(group)
        return table

    def _read_row_group(self, file: int, group: int) -> Any:
        """Decode row group `group` of file `file`, selected columns only: a `pyarrow.Table`;
        from a store, retried through an outage."""
        if self._store is None:
            return self._read_row_group_once(file, group)
        return self._store.retried(partial(self._read_row_group_once, file, group))

    def _read_row_group_once(self, file: int, group: int) -> Any:
        state = self._states.get()
        handle = state.files.get(file)
        path = self._paths[file]
        if handle is None:
            handle = self._open(file, state.filesystem)
            state.files[file] = handle
            if len(state.files) > _OPEN_FILES:
                state.files.popitem(last=False)[1].close()
        else:
            state.files.move_to_end(file)
        try:
            return handle.read_row_group(group, columns=list(self._columns))
        except OSError as error:
            if self._store is not None:  # the store's refusal, named with what to do
                raise self._store.explain(error, self._objects[file], "ParquetDataset") from None
            raise ValueError(
                f"ParquetDataset: cannot read row group {group} of {str(path)!r}: {error}"
            ) from None
        except pa.ArrowException as error:
            raise ValueError(
                f"ParquetDataset: cannot read row group {group} of {str(path)!r}: {error}"
            ) from None

    def _open(self, file: int, filesystem: Any) -> Any:
        """File `file` as a `pyarrow.parquet.ParquetFile`, from `filesystem` for a store's."""
        if self._store is None:
            return _open(Path(self._paths[file]))
        location = self._objects[file]
        try:
            # pre_buffer: a row group's selected column chunks in few ranged requests.
            return pq.ParquetFile(location.path, filesystem=filesystem, pre_buffer=True)
        except OSError as error:
            raise self._store.explain(error, location, "ParquetDataset") from None
        except pa.ArrowException as error:
            raise ValueError(
                f"ParquetDataset: {location.shown!r} is not a readable Parquet file: {error}"
            ) from None


class _ThreadState:
    """One reading thread's filesystem (a store's), open files and decoded row groups, least
    recently used first."""

    def __init__(self, store: Store | None) -> None:
        self.filesystem = None if store is None else store.copy()
        self.files: OrderedDict[int, Any] = OrderedDict()
        self.groups: OrderedDict[int, Any] = OrderedDict()

    def close(self) -> None:
        self.groups.clear()
        while self.files:
            self.files.popitem()[1].close()


def _open(path: Path) -> Any:
    shown = repr(str(path))
    if path.is_dir():
        raise ValueError(
            f"ParquetDataset: {shown} is a directory; pass its files in the order you want, "
            "e.g. sorted(Path(directory).glob('*.parquet'))"
        )
    if not path.is_file():
        raise FileNotFoundError(f"ParquetDataset: no Parquet file at {shown}")
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(
            f"ParquetDataset: {shown} is not a readable Parquet file: {error}"
        ) from None


def _check_schema(path: Path | str, schema: Any, types: dict[str, Any], first: Path | str) -> None:
    for name, expected in types.items():
        if name not in schema.names:
            raise ValueError(
                f"ParquetDataset: {str(path)!r} has no column {name!r}, which {str(first)!r} "
                f"has; its columns are {list(schema.names)}"
            )
        found = schema.field(name).type
        if found != expected:
            raise ValueError(
                f"ParquetDataset: column {name!r} is {found} in {str(path)!r} but {expected} in "
                f"{str(first)!r}; the files' schemas must agree in the selected columns"
            )


def _is_plain(kind: Any) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    )


def _values(column: Any) -> list[Any]:
    """The values of a `pyarrow.ChunkedArray`, typed by the column alone, never by the batch."""
    kind = column.type
    if _is_plain(kind):
        if column.null_count == 0:
            return list(column.to_numpy())
        present = iter(column.drop_null().to_numpy())
        return [next(present) if valid else None for valid in column.is_valid().to_pylist()]
    if pa.types.is_fixed_size_list(kind) and _is_plain(kind.value_type):
        if column.null_count == 0:
            flat = pa.chunked_array([chunk.flatten() for chunk in column.chunks], kind.value_type)
            if flat.null_count == 0:
                return list(flat.to_numpy().reshape(len(column), kind.list_size))
        return _arrays(column.to_pylist(), np.dtype(kind.value_type.to_pandas_dtype()))
    values: list[Any] = column.to_pylist()
    return values


def _arrays(rows: list[Any], dtype: np.dtype[Any]) -> list[Any]:
    """Rows of fixed-size lists as arrays, but a null row, or one holding nulls, as it is."""
    return [row if row is None or None in row else np.array(row, dtype=dtype) for row in rows]
