"""Parquet files as a dataset: record i is row i across the files, read by row group."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.columns import check_columns, choose_columns
from loadax.sources.handles import HandlePool

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
    ) -> None:
        self._paths = _paths(paths)
        check_columns(columns, "ParquetDataset")
        if columns is not None and not columns:
            raise ValueError("ParquetDataset: columns must name at least one column")
        self._columns: tuple[str, ...] = ()
        counts: list[int] = []
        files: list[int] = []
        first_types: dict[str, Any] = {}
        for position, path in enumerate(self._paths):
            handle = _open(path)
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
        self._states = HandlePool(_ThreadState, _ThreadState.close)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files, in the order their rows are numbered."""
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
        # Pickled by path (for worker processes): unpickling reads the footers again.
        paths = [path.absolute() for path in self._paths]
        return (type(self), (paths, self._columns or None))  # None: a file without columns

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
        """Decode row group `group` of file `file`, selected columns only: a `pyarrow.Table`."""
        state = self._states.get()
        handle = state.files.get(file)
        path = self._paths[file]
        if handle is None:
            handle = _open(path)
            state.files[file] = handle
            if len(state.files) > _OPEN_FILES:
                state.files.popitem(last=False)[1].close()
        else:
            state.files.move_to_end(file)
        try:
            return handle.read_row_group(group, columns=list(self._columns))
        except (pa.ArrowException, OSError) as error:
            raise ValueError(
                f"ParquetDataset: cannot read row group {group} of {str(path)!r}: {error}"
            ) from None


class _ThreadState:
    """One reading thread's open files and decoded row groups, least recently used first."""

    def __init__(self) -> None:
        self.files: OrderedDict[int, Any] = OrderedDict()
        self.groups: OrderedDict[int, Any] = OrderedDict()

    def close(self) -> None:
        self.groups.clear()
        while self.files:
            self.files.popitem()[1].close()


def _paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> tuple[Path, ...]:
    if isinstance(paths, str | os.PathLike):
        chosen = [paths]
    elif isinstance(paths, Sequence):
        chosen = list(paths)
    else:
        raise ValueError(
            f"ParquetDataset: paths must be a path or a sequence of paths, got {paths!r}"
        )
    if not chosen:
        raise ValueError("ParquetDataset: paths must not be empty")
    result = []
    for path in chosen:
        if not isinstance(path, str | os.PathLike):
            raise ValueError(f"ParquetDataset: paths must be str or os.PathLike, got {path!r}")
        result.append(Path(path))
    return tuple(result)


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


def _check_schema(path: Path, schema: Any, types: dict[str, Any], first: Path) -> None:
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
