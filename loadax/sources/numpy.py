"""A `.npy` file as a dataset: record i is row i, read memory-mapped without loading the file, or
from an object store by ranged reads of the rows."""

from __future__ import annotations

import io
import os
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.filesystems import Store, store_of
from loadax.sources.handles import HandlePool
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy
from loadax.sources.storage_errors import Location
from loadax.validation import require_bool

_HEADER_READ = 1 << 16  # bytes of an object read for its header: all of almost every header


class NumpyDataset(DatasetBase[Any]):
    """The rows of the array in the `.npy` file at `path`: arrays, or numpy scalars for a 1-D file.

    With `mmap` (the default) the file is memory-mapped read-only, so only the rows read are paged
    in; otherwise it is loaded whole. Each batch is one fancy-index read. Object arrays are
    refused, since reading them would unpickle code from the file.

    `path` may be an object's URL (`s3://bucket/rows.npy`, `gs://...`), or a path in
    `filesystem` (a `pyarrow.fs.FileSystem` or an fsspec filesystem); see `ParquetDataset` for
    how stores are reached. An object cannot be memory-mapped: with `mmap` its header is read
    once (one request of 64 KiB), and each batch reads its rows by ranged requests, one per run
    of consecutive rows, straight into the batch's array, each thread on its own file handle.
    That suits large rows or mostly sequential reads; for many small rows read in shuffled
    order (one request each), copy the file to local disk or store it as Parquet. A Fortran-
    ordered array has no contiguous rows and is refused (unless `mmap=False`, which reads the
    whole object once, when the dataset is made). Ranged reads are retried through an outage
    under `retries`, as `ParquetDataset` says.

    >>> import pathlib
    >>> import tempfile
    >>> import numpy as np
    >>> from loadax import NumpyDataset
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     path = pathlib.Path(directory) / "rows.npy"
    ...     np.save(path, np.arange(6).reshape(3, 2))
    ...     dataset = NumpyDataset(path)
    ...     print(len(dataset), dataset[1].tolist())
    3 [2, 3]
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        mmap: bool = True,
        filesystem: Any = None,
        retries: RetryPolicy = DEFAULT_RETRIES,
    ) -> None:
        self._mmap = require_bool("mmap", mmap)
        found = store_of([path], filesystem, "NumpyDataset", retries=retries)
        self._path: Path | str
        self._object: _RangedRows | None = None  # an object in a store
        self._array: np.ndarray[Any, Any] | None  # a local file's map, or the array loaded whole
        if found is None:
            self._path = Path(path)
            self._array = _open(self._path, self._mmap)
            self._length = int(self._array.shape[0])
            return
        store, locations = found
        if len(locations) != 1:
            raise ValueError(
                f"NumpyDataset: {str(path)!r} names {len(locations)} objects; a NumpyDataset "
                "reads one (ConcatenatedDataset joins several)"
            )
        self._path = locations[0].shown
        self._object = _RangedRows(store, locations[0], self._mmap)
        self._array = self._object.loaded
        self._length = self._object.shape[0]

    def __len__(self) -> int:
        return self._length

    def read(self, indices: IndexArray, epoch: int) -> list[Any]:
        return list(self.read_rows(indices, epoch))

    @property
    def reads_rows(self) -> bool:
        return True

    def read_rows(self, indices: IndexArray, epoch: int) -> np.ndarray[Any, Any]:
        if self._array is None:  # an object read by ranges
            return cast(_RangedRows, self._object).read(indices)
        # Fancy indexing copies the rows out of the map, in one pass over the file.
        return self._array[indices]

    @property
    def path(self) -> Path | str:
        """The file, or the object's URL (a str)."""
        return self._path

    def __repr__(self) -> str:
        return f"NumpyDataset({str(self._path)!r}{'' if self._mmap else ', mmap=False'})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path (for loader processes): unpickling maps the file again, never a copy;
        # an object's by its path in the store and the store's options, never an open handle.
        if self._object is None:
            return (type(self), (Path(self._path).absolute(), self._mmap))
        location, store = self._object.location, self._object.store
        return (type(self), (location.path, self._mmap, store.user_filesystem, store.retries))


def _header(file: BinaryIO, shown: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """The shape, Fortran order and dtype that the header at the start of `file` declares,
    checked: `file` is left at the first byte of the data."""
    try:
        version = np.lib.format.read_magic(file)
        # Version 3.0 differs from 2.0 only in allowing utf-8 field names.
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(file)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"NumpyDataset: {shown} is not a valid .npy file: {error}") from None
    # Refused from the header alone: reading an object array would unpickle data from the file.
    if np.dtype(dtype).hasobject:
        raise ValueError(
            f"NumpyDataset: {shown} holds an object array ({dtype}), which would need pickle "
            "to read; store a numeric, string or structured dtype instead"
        )
    if not shape:
        raise ValueError(f"NumpyDataset: {shown} holds a 0-d array, which has no rows")
    return tuple(shape), bool(fortran), np.dtype(dtype)


def _open(path: Path, mmap: bool) -> np.ndarray[Any, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"NumpyDataset: no .npy file at {str(path)!r}")
    shown = repr(str(path))
    with path.open("rb") as file:
        _header(file, shown)
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"NumpyDataset: cannot read {shown}: {error}") from None
    if not isinstance(array, np.ndarray):  # the magic check above rules out .npz archives
        raise ValueError(f"NumpyDataset: {shown} is not a single .npy array")
    return array


class _RangedRows:
    """The rows of a `.npy` object in a store, read by ranged requests (objects have no mmap)."""

    def __init__(self, store: Store, location: Location, mmap: bool) -> None:
        self.store, self.location = store, location
        shown = repr(location.shown)
        file = self._open_file(store.filesystem)
        try:
            size = int(file.size())
            head = self._read_at(file, min(size, _HEADER_READ), 0)
            end = _header_end(head)
            if len(head) < end <= size:  # a header longer than the first read (rare)
                head = self._read_at(file, end, 0)
            buffer = io.BytesIO(head)
            shape, fortran, dtype = _header(buffer, shown)
            self.offset = buffer.tell()
            self.dtype, self.shape = dtype, shape
            self.row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
            needed = self.offset + self.row_bytes * shape[0]
            if size < needed:
                raise ValueError(
                    f"NumpyDataset: cannot read {shown}: it holds {size} bytes, but its header "
                    f"declares {needed} (the object is truncated)"
                )
            if mmap and fortran and len(shape) > 1:
                raise ValueError(
                    f"NumpyDataset: {shown} is Fortran-ordered, so its rows are not contiguous "
                    "and cannot be read by ranges: save it C-ordered (np.ascontiguousarray), "
                    "or pass mmap=False to read it whole"
                )
            # The whole array, when asked for (mmap=False): one request for the whole object.
            self.loaded: np.ndarray[Any, Any] | None = (
                None
                if mmap
                else np.load(io.BytesIO(self._read_at(file, size, 0)), allow_pickle=False)
            )
        finally:
            file.close()
        self._files = HandlePool(partial(_thread_file, store, location), _close)

    def read(self, indices: IndexArray) -> np.ndarray[Any, Any]:
        """Rows `indices` (in range), each run of consecutive rows in one ranged request,
        retried through an outage."""
        unique, inverse = np.unique(indices, return_inverse=True)
        rows = np.empty((len(unique), *self.shape[1:]), dtype=self.dtype)
        if rows.nbytes:
            target = rows.reshape(-1).view(np.uint8)
            starts = np.flatnonzero(np.diff(unique, prepend=unique[0] - 2) != 1)
            ends = np.append(starts[1:], len(unique))
            size = self.row_bytes
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                run = target[start * size : end * size]
                offset = self.offset + int(unique[start]) * size
                self.store.retried(partial(self._read_run, run, offset))
        return rows[inverse]

    def _read_run(self, run: np.ndarray[Any, Any], offset: int) -> None:
        """Fill `run` with the bytes of the object from `offset`, through this thread's file."""
        file = self._files.get()
        file.seek(offset)
        try:
            got = file.readinto(run.data)
        except OSError as error:
            raise self.store.explain(error, self.location, "NumpyDataset") from None
        if got != len(run):
            raise ValueError(
                f"NumpyDataset: {self.location.shown!r} ended early: the object changed "
                "while it was read"
            )

    def _open_file(self, filesystem: Any) -> Any:
        try:
            return filesystem.open_input_file(self.location.path)
        except OSError as error:
            raise self.store.explain(error, self.location, "NumpyDataset") from None

    def _read_at(self, file: Any, size: int, offset: int) -> bytes:
        try:
            return bytes(file.read_at(size, offset))
        except OSError as error:
            raise self.store.explain(error, self.location, "NumpyDataset") from None


def _thread_file(store: Store, location: Location) -> Any:
    """One thread's handle on the object, on the thread's own copy of the filesystem."""
    try:
        return store.copy().open_input_file(location.path)
    except OSError as error:
        raise store.explain(error, location, "NumpyDataset") from None


def _close(file: Any) -> None:
    file.close()


def _header_end(head: bytes) -> int:
    """Where the data of a .npy file starting with `head` begins (0 if `head` cannot say)."""
    if len(head) < 12 or not head.startswith(b"\x93NUMPY"):
        return 0
    if head[6] == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")
