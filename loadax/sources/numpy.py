"""A `.npy` file as a dataset: record i is row i, read memory-mapped without loading the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.validation import require_bool


class NumpyDataset(DatasetBase[Any]):
    """The rows of the array in the `.npy` file at `path`: arrays, or numpy scalars for a 1-D file.

    With `mmap` (the default) the file is memory-mapped read-only, so only the rows read are paged
    in; otherwise it is loaded whole. Each batch is one fancy-index read. Object arrays are
    refused, since reading them would unpickle code from the file.

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

    def __init__(self, path: str | os.PathLike[str], mmap: bool = True) -> None:
        self._path = Path(path)
        self._mmap = require_bool("mmap", mmap)
        self._array = _open(self._path, self._mmap)

    def __len__(self) -> int:
        return int(self._array.shape[0])

    def read(self, indices: IndexArray, epoch: int) -> list[Any]:
        return list(self.read_rows(indices, epoch))

    @property
    def reads_rows(self) -> bool:
        return True

    def read_rows(self, indices: IndexArray, epoch: int) -> np.ndarray[Any, Any]:
        # Fancy indexing copies the rows out of the map, in one pass over the file.
        return self._array[indices]

    @property
    def path(self) -> Path:
        return self._path

    def __repr__(self) -> str:
        return f"NumpyDataset({str(self._path)!r}{'' if self._mmap else ', mmap=False'})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path (for worker processes): unpickling maps the file again, never a copy.
        return (type(self), (self._path.absolute(), self._mmap))


def _open(path: Path, mmap: bool) -> np.ndarray[Any, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"NumpyDataset: no .npy file at {str(path)!r}")
    shown = repr(str(path))
    try:
        with path.open("rb") as file:
            version = np.lib.format.read_magic(file)
            # Version 3.0 differs from 2.0 only in allowing utf-8 field names.
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(file)
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
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"NumpyDataset: cannot read {shown}: {error}") from None
    if not isinstance(array, np.ndarray):  # the magic check above rules out .npz archives
        raise ValueError(f"NumpyDataset: {shown} is not a single .npy array")
    return array
