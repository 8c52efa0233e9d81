"""Column selection shared by the table sources."""

from __future__ import annotations

from typing import Any

import pytest

from loadax.sources.columns import check_columns, choose_columns


def test_none_chooses_every_column_in_order() -> None:
    assert choose_columns(None, ["a", "b"], source="S", table="t") == ("a", "b")
    assert choose_columns(["b", "a"], ["a", "b", "c"], source="S", table="t") == ("b", "a")


@pytest.mark.parametrize(
    ("columns", "names", "message"),
    [
        (["a", "z"], ["a", "b"], r"^S: the table has no column 'z'; its columns are \['a', 'b'\]$"),
        (["a", "a"], ["a", "b"], r"^S: columns \['a', 'a'\] name a column twice$"),
        (None, ["a", "a"], r"^S: the table has several columns named \['a'\]$"),
    ],
)
def test_bad_choices_name_the_source_the_table_and_the_columns(
    columns: Any, names: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        choose_columns(columns, names, source="S", table="the table")


@pytest.mark.parametrize("columns", ["a", ["a", 1], [b"a"]])
def test_columns_must_be_a_sequence_of_names(columns: Any) -> None:
    with pytest.raises(ValueError, match=r"^S: columns must be a sequence of str"):
        check_columns(columns, "S")
    check_columns(None, "S")
    check_columns(["a"], "S")
