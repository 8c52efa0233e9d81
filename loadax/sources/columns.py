"""Column selection for table-like sources; every error names the source and the table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_columns(columns: Any, source: str) -> None:
    """Refuse `columns` unless it is None or a sequence of column names."""
    if columns is not None and (
        isinstance(columns, str) or not all(isinstance(column, str) for column in columns)
    ):
        raise ValueError(f"{source}: columns must be a sequence of str, got {columns!r}")


def choose_columns(
    columns: Sequence[str] | None, names: Sequence[str], *, source: str, table: str
) -> tuple[str, ...]:
    """The chosen columns of a table with columns `names` (all of them for None), checked."""
    chosen = tuple(names) if columns is None else tuple(columns)
    unknown = [column for column in chosen if column not in names]
    if unknown:
        raise ValueError(
            f"{source}: {table} has no column {', '.join(map(repr, unknown))}; "
            f"its columns are {list(names)}"
        )
    repeated = sorted({column for column in chosen if list(names).count(column) > 1})
    if repeated:
        raise ValueError(f"{source}: {table} has several columns named {repeated}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"{source}: columns {list(chosen)} name a column twice")
    return chosen
