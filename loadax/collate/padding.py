"""A `Batcher` for ragged records: pads leading dimensions and adds masks for dict records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from loadax.collate.batcher import Batcher, leaf_columns
from loadax.validation import require_int

_LEAF = jax.tree.structure(0)


class PaddedStack:
    """Stack records leaf-wise like `loadax.stack`, padding ragged leading dimensions.

    Every array leaf of one or more dimensions is padded on its first axis with `pad_value`, up
    to the longest in the batch, or to `length` when given (a longer record is an error). Only
    the first axis may differ between records. With `keys`, records must be dicts and only the
    leaves under those keys are padded; the others are stacked as by `loadax.stack`. For dict
    records, each padded key whose value is a single array gets a boolean `f"{key}_mask"` of
    shape (batch, padded length), true on real entries. Scalars are stacked as they are.

    >>> import numpy as np
    >>> from loadax import PaddedStack
    >>> batch = PaddedStack(pad_value=-1)([{"ids": np.array([1, 2, 3])}, {"ids": np.array([4])}])
    >>> batch["ids"].tolist()
    [[1, 2, 3], [4, -1, -1]]
    >>> batch["ids_mask"].tolist()
    [[True, True, True], [True, False, False]]
    """

    def __init__(
        self,
        pad_value: Any = 0,
        length: int | None = None,
        keys: Iterable[str] | None = None,
    ) -> None:
        self.pad_value = pad_value
        self.length = None if length is None else require_int("length", length, minimum=0)
        self.keys = None if keys is None else tuple(keys)
        if self.keys is not None and not all(isinstance(key, str) for key in self.keys):
            raise ValueError(f"keys must be strings, got {self.keys!r}")

    def __repr__(self) -> str:
        return f"PaddedStack(pad_value={self.pad_value!r}, length={self.length}, keys={self.keys})"

    def __call__(self, records: list[Any]) -> Any:
        if not records:
            raise ValueError("cannot stack an empty list of records")
        if not isinstance(records[0], Mapping):
            if self.keys is not None:
                raise ValueError(f"keys needs dict records, got {type(records[0]).__name__}")
            return self._pad_tree(records, "")[0]
        for position, record in enumerate(records):
            if not isinstance(record, Mapping) or record.keys() != records[0].keys():
                raise ValueError(
                    f"record {position} of the batch has keys {_keys(record)}, "
                    f"but record 0 has {_keys(records[0])}"
                )
        padded = records[0].keys() if self.keys is None else self.keys
        for key in padded:
            if key not in records[0]:
                raise ValueError(f"key {key!r} is not in the records' keys {_keys(records[0])}")
        batch: dict[Any, Any] = {}
        masks: dict[str, Any] = {}
        for key in records[0]:
            column = [record[key] for record in records]
            if key not in padded:
                batch[key] = _stack_tree(column, f"[{key!r}]")
                continue
            batch[key], mask = self._pad_tree(column, f"[{key!r}]")
            if mask is not None:
                masks[f"{key}_mask"] = mask
        for name, mask in masks.items():
            if name in batch:
                raise ValueError(f"the mask {name!r} would replace the record's own key {name!r}")
            batch[name] = mask
        return batch

    def _pad_tree(self, column: list[Any], where: str) -> tuple[Any, Any]:
        """The padded stack of a column of pytrees, and the mask if the column is of arrays."""
        structure, columns = leaf_columns(column, where)
        paths = jax.tree_util.tree_flatten_with_path(column[0])[0]
        padded = [
            self._pad(leaves, where + jax.tree_util.keystr(path))
            for (path, _), leaves in zip(paths, columns, strict=True)
        ]
        stacked = jax.tree.unflatten(structure, [array for array, _ in padded])
        return stacked, padded[0][1] if structure == _LEAF else None

    def _pad(self, leaves: list[Any], where: str) -> tuple[Any, Any]:
        arrays = [np.asarray(leaf) for leaf in leaves]
        first = arrays[0]
        for position, array in enumerate(arrays):
            if array.ndim != first.ndim or array.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"leaf {where or 'record'} of record {position} has shape {array.shape}, but "
                    f"record 0's has {first.shape}; only the first dimension may differ"
                )
        if first.ndim == 0:
            return np.stack(arrays), None
        lengths = np.array([array.shape[0] for array in arrays], dtype=np.int64)
        size = int(lengths.max())
        if self.length is not None:
            too_long = np.flatnonzero(lengths > self.length)
            if too_long.size:
                position = int(too_long[0])
                raise ValueError(
                    f"leaf {where or 'record'} of record {position} has length "
                    f"{int(lengths[position])}, longer than length={self.length}"
                )
            size = self.length
        dtype = np.result_type(*arrays)
        out = np.full((len(arrays), size, *first.shape[1:]), self.pad_value, dtype=dtype)
        for position, array in enumerate(arrays):
            out[position, : array.shape[0]] = array
        mask = np.arange(size)[None, :] < lengths[:, None]
        return out, mask


def pad_batcher(
    pad_value: Any = 0, length: int | None = None, keys: Iterable[str] | None = None
) -> Batcher[Any, Any]:
    """A `Batcher` that pads ragged records; see `PaddedStack` for the rules.

    >>> import numpy as np
    >>> from loadax import DataLoader, InMemoryDataset, pad_batcher
    >>> records = InMemoryDataset([{"ids": np.array([1, 2])}, {"ids": np.array([3])}])
    >>> loader = DataLoader(pad_batcher(0, length=4)).batch_size(2).build(records)
    >>> next(iter(loader))["ids"].tolist()
    [[1, 2, 0, 0], [3, 0, 0, 0]]
    """
    return Batcher(PaddedStack(pad_value, length, keys))


def _keys(record: Any) -> str:
    return repr(list(record.keys())) if isinstance(record, Mapping) else type(record).__name__


def _stack_tree(column: list[Any], where: str) -> Any:
    structure, columns = leaf_columns(column, where)
    return jax.tree.unflatten(structure, [np.stack(leaves) for leaves in columns])
