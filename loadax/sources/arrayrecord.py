"""ArrayRecord files as a dataset: record i is the i-th record of the files in order, as bytes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader
from typing_extensions import TypeVar

from loadax.dataset.names import callable_name
from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.filesystems import is_url
from loadax.sources.handles import HandlePool

T = TypeVar("T", default=bytes)

# Read-ahead serves sequential scans; for random access it reads (and discards) chunks ahead.
_READER_OPTIONS = "readahead_buffer_size:0"


class ArrayRecordDataset(DatasetBase[T]):
    """The records of the ArrayRecord files at `paths`, file after file: bytes, or `decode(bytes)`.

    Each reading thread opens its own readers, lazily, with read-ahead disabled, since a shuffled
    read jumps around the file; each batch is one batched read per file it touches. The files'
    record counts are read once, when the dataset is made, and the files must not change after.

    >>> import pathlib
    >>> import tempfile
    >>> from array_record.python.array_record_module import ArrayRecordWriter
    >>> from loadax.sources.arrayrecord import ArrayRecordDataset
    >>> directory = tempfile.TemporaryDirectory()
    >>> path = pathlib.Path(directory.name) / "records.array_record"
    >>> writer = ArrayRecordWriter(str(path), "group_size:1")
    >>> for record in (b"a", b"bb", b"ccc"):
    ...     writer.write(record)
    >>> writer.close()
    >>> raw, sizes = ArrayRecordDataset(path), ArrayRecordDataset(path, decode=len)
    >>> len(raw), raw[1], list(sizes)
    (3, b'bb', [1, 2, 3])
    >>> raw.close()
    >>> sizes.close()
    >>> directory.cleanup()
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        decode: Callable[[bytes], T] | None = None,
    ) -> None:
        listed = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
        if not listed:
            raise ValueError("ArrayRecordDataset: paths must not be empty")
        if decode is not None and not callable(decode):
            raise ValueError(f"ArrayRecordDataset: decode must be callable, got {decode!r}")
        urls = [path for path in listed if is_url(path)]
        if urls:
            raise ValueError(
                f"ArrayRecordDataset: {urls[0]!r} is a URL, but ArrayRecord's reader reads local "
                "files only: copy the files to local disk first, or store the records as "
                "Parquet or NumPy files, which read from object stores"
            )
        self._paths = tuple(Path(path) for path in listed)
        self._decode = decode
        self._readers = HandlePool(partial(_open_all, self._paths), _close_all)
        lengths = []
        for path in self._paths:
            reader = _open(path)
            try:
                lengths.append(int(reader.num_records()))
            finally:
                reader.close()
        # _ends[f] is one past the last global index of file f.
        self._ends = np.cumsum(np.array(lengths, dtype=np.int64))
        self._starts = self._ends - np.array(lengths, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1])

    @property
    def paths(self) -> tuple[Path, ...]:
        return self._paths

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        if indices.size == 0:
            return []
        owners = np.searchsorted(self._ends, indices, side="right")
        local = indices - self._starts[owners]
        records: list[bytes | None] = [None] * len(indices)
        readers = self._readers.get()
        for owner in np.unique(owners).tolist():
            (positions,) = np.nonzero(owners == owner)
            try:
                found = readers[owner].read(local[positions].tolist())
            except RuntimeError as error:
                raise ValueError(
                    f"ArrayRecordDataset: cannot read {str(self._paths[owner])!r}: {error}"
                ) from None
            for position, record in zip(positions.tolist(), found, strict=True):
                records[position] = record
        raw = cast(list[bytes], records)
        if self._decode is None:
            return cast(list[T], raw)
        return [self._decode(record) for record in raw]

    def close(self) -> None:
        """Close every thread's readers; a later read opens new ones."""
        self._readers.close()

    def __repr__(self) -> str:
        shown = [str(path) for path in self._paths]
        decode = "" if self._decode is None else f", decode={callable_name(self._decode)}"
        return f"ArrayRecordDataset({shown!r}{decode})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path (for loader processes): unpickling opens the files again.
        return (type(self), ([path.absolute() for path in self._paths], self._decode))


def _open_all(paths: tuple[Path, ...]) -> list[Any]:
    """A reader of each file of `paths`, in order: one thread's readers."""
    return [_open(path) for path in paths]


def _close_all(readers: list[Any]) -> None:
    for reader in readers:
        reader.close()


def _open(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"ArrayRecordDataset: no ArrayRecord file at {str(path)!r}")
    reader = ArrayRecordReader(str(path), _READER_OPTIONS)
    if not reader.ok():
        # The reader does not raise when it opens; an empty read reports why it failed.
        try:
            reader.read([])
        except RuntimeError as error:
            reason = str(error)
        else:
            reason = "the reader failed"
        with contextlib.suppress(RuntimeError):  # close reports the same failure again
            reader.close()
        raise ValueError(f"ArrayRecordDataset: {str(path)!r} is not an ArrayRecord file: {reason}")
    return reader
