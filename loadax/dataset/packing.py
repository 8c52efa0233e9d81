"""Sequence packing: variable-length token sequences into rows of a fixed length.

Each sequence goes into the first row with room for it, in order (`first_fit`); or, longest
first, into the row it fills best, the one with the least room that still takes it (`best_fit`,
best-fit decreasing): fewer rows part-empty, so less padding (benchmarks P2: 26 % less than
first-fit at a window of 1,024 sequences, 14 % at the default 256). Both pack within a window.

Each output row holds whole sequences back to back, then padding. `segment_ids` numbers the
sequences of a row from 1 (0 is padding) and `positions` counts from 0 within each sequence, as
LLM trainers need for attention masks and position embeddings. No token is lost or reordered
within its sequence; a sequence longer than a row is an error unless `truncate` is set.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from loadax.validation import is_number, require_bool, require_int

TOKENS = "tokens"
"""The output key of the tokens of records that are bare sequences rather than dicts."""
SEGMENT_IDS = "segment_ids"
POSITIONS = "positions"

PackedRow = dict[str, npt.NDArray[Any]]

PackingStrategy = Literal["first_fit", "best_fit"]


@dataclasses.dataclass(frozen=True, slots=True)
class Packer:
    """Packs sequences into rows of `length` tokens, each into the first row with room for it,
    or (`strategy="best_fit"`) into the row with the least room that takes it.

    A record is a 1-D sequence of tokens, or a dict of 1-D sequences of one length (e.g. inputs
    and targets), packed together. Rows come out in the order they were opened.

    >>> from loadax.dataset.packing import Packer
    >>> rows = Packer(length=5)([[1, 2, 3], [4, 5, 6, 7], [8, 9]])
    >>> [row["tokens"].tolist() for row in rows]
    [[1, 2, 3, 8, 9], [4, 5, 6, 7, 0]]
    >>> [row["segment_ids"].tolist() for row in rows]
    [[1, 1, 1, 2, 2], [1, 1, 1, 1, 0]]
    >>> [row["positions"].tolist() for row in rows]
    [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    >>> sequences = [[1] * 3, [2] * 4, [3], [4] * 2]
    >>> [row["tokens"].tolist() for row in Packer(5)(sequences)]
    [[1, 1, 1, 3, 0], [2, 2, 2, 2, 0], [4, 4, 0, 0, 0]]
    >>> [row["tokens"].tolist() for row in Packer(5, strategy="best_fit")(sequences)]
    [[2, 2, 2, 2, 3], [1, 1, 1, 4, 4]]
    """

    length: int
    pad_value: int | float = 0
    truncate: bool = False
    strategy: PackingStrategy = "first_fit"

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", require_int("length", self.length, minimum=1))
        if not is_number(self.pad_value):
            raise ValueError(f"pad_value must be a number, got {self.pad_value!r}")
        require_bool("truncate", self.truncate)
        if self.strategy not in get_args(PackingStrategy):
            raise ValueError(
                f"strategy must be one of {list(get_args(PackingStrategy))}, got {self.strategy!r}"
            )

    def __call__(
        self, records: Sequence[Any], indices: Sequence[int] | None = None
    ) -> list[PackedRow]:
        """The packed rows of `records`; errors name a record by its entry of `indices`."""
        names = range(len(records)) if indices is None else indices
        sequences = [
            self._columns(record, name) for record, name in zip(records, names, strict=True)
        ]
        if not sequences:
            return []
        keys = list(sequences[0])
        for name, columns in zip(names, sequences, strict=True):
            if list(columns) != keys:
                raise ValueError(
                    f"record {name} has keys {list(columns)}, record {names[0]} has {keys}"
                )
        sequences = [columns for columns in sequences if _size(columns)]
        if not sequences:
            return []
        rows = row_members([_size(columns) for columns in sequences], self.length, self.strategy)
        return [self._row(row, sequences, keys) for row in rows]

    def _columns(self, record: Any, name: int) -> dict[str, npt.NDArray[Any]]:
        named = record if isinstance(record, Mapping) else {TOKENS: record}
        columns: dict[str, npt.NDArray[Any]] = {}
        for key, value in named.items():
            if key in (SEGMENT_IDS, POSITIONS):
                raise ValueError(f"record {name} has a key {key!r}, which packing adds itself")
            column = np.asarray(value)
            if column.ndim != 1:
                raise ValueError(
                    f"record {name}: {key!r} must be a 1-D sequence of tokens, "
                    f"got shape {column.shape}"
                )
            columns[str(key)] = column
        sizes = {key: column.size for key, column in columns.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"record {name} has sequences of different lengths: {sizes}")
        size = next(iter(sizes.values()), 0)
        if size > self.length:
            if not self.truncate:
                raise ValueError(
                    f"record {name} has {size} tokens, more than a packed row of "
                    f"{self.length}; pass truncate=True to cut it"
                )
            columns = {key: column[: self.length] for key, column in columns.items()}
        return columns

    def _row(
        self, members: list[int], sequences: list[dict[str, npt.NDArray[Any]]], keys: list[str]
    ) -> PackedRow:
        row: PackedRow = {}
        for key in keys:
            parts = [sequences[member][key] for member in members]
            values = np.full(self.length, self.pad_value, dtype=np.result_type(*parts))
            filled = np.concatenate(parts)
            values[: filled.size] = filled
            row[key] = values
        sizes = np.array([_size(sequences[member]) for member in members], dtype=np.int64)
        used = int(sizes.sum())
        segment_ids = np.zeros(self.length, dtype=np.int32)
        segment_ids[:used] = np.repeat(np.arange(1, len(members) + 1, dtype=np.int32), sizes)
        starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
        positions = np.zeros(self.length, dtype=np.int32)
        positions[:used] = np.arange(used) - starts
        row[SEGMENT_IDS], row[POSITIONS] = segment_ids, positions
        return row


def row_members(sizes: list[int], length: int, strategy: str) -> list[list[int]]:
    """For each row of `length` that packing sequences of `sizes` with `strategy` opens, the
    positions of the sequences placed in it, in placement order.

    >>> from loadax.dataset.packing import row_members
    >>> row_members([3, 4, 1, 2], 5, "first_fit"), row_members([3, 4, 1, 2], 5, "best_fit")
    ([[0, 2], [1], [3]], [[1, 2], [0, 3]])
    """
    return _STRATEGIES[strategy](sizes, length)


def _size(columns: Mapping[str, npt.NDArray[Any]]) -> int:
    return next(iter(columns.values())).size if columns else 0


def _first_fit(sizes: list[int], length: int) -> list[list[int]]:
    """For each row opened, the positions of the sequences placed in it, in placement order."""
    rows: list[list[int]] = []
    room: list[int] = []
    for position, size in enumerate(sizes):
        for row, free in enumerate(room):
            if size <= free:
                rows[row].append(position)
                room[row] = free - size
                break
        else:
            rows.append([position])
            room.append(length - size)
    return rows


def _best_fit(sizes: list[int], length: int) -> list[list[int]]:
    """Best-fit decreasing: the longest sequences first (the earlier of equals), each into the
    open row with the least room that takes it (the earliest opened of equals); a row keeps
    its sequences in their order."""
    rows: list[list[int]] = []
    by_room: list[tuple[int, int]] = []  # (room, row), ascending: the best fit is the first
    for position in sorted(range(len(sizes)), key=lambda position: -sizes[position]):
        size = sizes[position]
        found = bisect.bisect_left(by_room, (size, -1))
        if found < len(by_room):
            room, row = by_room.pop(found)
            rows[row].append(position)
        else:
            room, row = length, len(rows)
            rows.append([position])
        if room - size:
            bisect.insort(by_room, (room - size, row))
    return [sorted(members) for members in rows]


_STRATEGIES: dict[str, Callable[[list[int], int], list[list[int]]]] = {
    "first_fit": _first_fit,
    "best_fit": _best_fit,
}
