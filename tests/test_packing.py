"""Tests for first-fit sequence packing: no token lost, rows of the length, segment ids right."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax.dataset.packing import POSITIONS, SEGMENT_IDS, TOKENS, Packer

LENGTH = 12


def _sequences(lengths: list[int]) -> list[np.ndarray[Any, Any]]:
    """Sequence k has `lengths[k]` tokens, each 100 * (k + 1) + its position: all distinct."""
    return [100 * (k + 1) + np.arange(size, dtype=np.int32) for k, size in enumerate(lengths)]


def _segments(row: dict[str, np.ndarray[Any, Any]], key: str) -> list[np.ndarray[Any, Any]]:
    ids = row[SEGMENT_IDS]
    return [row[key][ids == segment] for segment in range(1, int(ids.max(initial=0)) + 1)]


def _first_fit_reference(lengths: list[int], length: int) -> list[list[int]]:
    rows: list[list[int]] = []
    for k, size in enumerate(lengths):
        if size == 0:
            continue
        for row in rows:
            if sum(lengths[member] for member in row) + size <= length:
                row.append(k)
                break
        else:
            rows.append([k])
    return rows


@settings(max_examples=400, deadline=None)
@given(lengths=st.lists(st.integers(0, LENGTH), max_size=40), pad=st.integers(-5, 5))
def test_packing_keeps_every_token_in_rows_of_the_length_with_right_segments(
    lengths: list[int], pad: int
) -> None:
    sequences = _sequences(lengths)
    rows = Packer(LENGTH, pad_value=pad)(sequences)

    placed = []
    for row in rows:
        assert set(row) == {TOKENS, SEGMENT_IDS, POSITIONS}
        for key in row:
            assert row[key].shape == (LENGTH,)
        assert row[TOKENS].dtype == np.int32
        assert row[SEGMENT_IDS].dtype == row[POSITIONS].dtype == np.int32
        ids = row[SEGMENT_IDS]
        used = int(np.count_nonzero(ids))
        assert used > 0, "no empty rows"
        # Segments 1..k, ascending, back to back from the start; then padding (id 0, position 0).
        assert np.all(ids[:used] >= 1)
        assert np.all(np.diff(ids[:used]) >= 0)
        assert np.all(np.diff(ids[:used]) <= 1)
        assert ids[0] == 1
        assert np.all(ids[used:] == 0)
        assert np.all(row[TOKENS][used:] == pad)
        assert np.all(row[POSITIONS][used:] == 0)
        for segment, tokens in enumerate(_segments(row, TOKENS), start=1):
            np.testing.assert_array_equal(
                row[POSITIONS][ids == segment], np.arange(tokens.size, dtype=np.int32)
            )
            placed.append(int(tokens[0]) // 100 - 1)
            np.testing.assert_array_equal(tokens, sequences[placed[-1]])

    # Every non-empty sequence exactly once, in the rows first-fit chooses.
    assert sorted(placed) == [k for k, size in enumerate(lengths) if size]
    expected_rows = _first_fit_reference(lengths, LENGTH)
    assert [[int(t[0]) // 100 - 1 for t in _segments(row, TOKENS)] for row in rows] == expected_rows


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 3 * LENGTH), max_size=20))
def test_truncation_cuts_long_sequences_to_the_row_length(lengths: list[int]) -> None:
    sequences = _sequences(lengths)
    rows = Packer(LENGTH, truncate=True)(sequences)
    segments = [segment for row in rows for segment in _segments(row, TOKENS)]
    assert sorted(int(s[0]) // 100 - 1 for s in segments) == [k for k, n in enumerate(lengths) if n]
    for segment in segments:
        original = sequences[int(segment[0]) // 100 - 1]
        np.testing.assert_array_equal(segment, original[:LENGTH])


def test_dicts_of_sequences_pack_together_and_keep_their_dtypes() -> None:
    records = [
        {"inputs": np.array([1, 2, 3], dtype=np.int16), "targets": np.array([2.0, 3.0, 4.0])},
        {"inputs": np.array([5, 6], dtype=np.int16), "targets": np.array([6.0, 7.0])},
    ]
    (row,) = Packer(6, pad_value=-1)(records)
    np.testing.assert_array_equal(row["inputs"], [1, 2, 3, 5, 6, -1])
    assert row["inputs"].dtype == np.int16
    np.testing.assert_array_equal(row["targets"], [2.0, 3.0, 4.0, 6.0, 7.0, -1.0])
    assert row["targets"].dtype == np.float64
    np.testing.assert_array_equal(row[SEGMENT_IDS], [1, 1, 1, 2, 2, 0])
    np.testing.assert_array_equal(row[POSITIONS], [0, 1, 2, 0, 1, 0])


def test_plain_lists_of_tokens_pack() -> None:
    rows = Packer(4)([[7, 8, 9], [1], [2, 3]])
    assert [row[TOKENS].tolist() for row in rows] == [[7, 8, 9, 1], [2, 3, 0, 0]]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([np.arange(5)], "record 0 has 5 tokens, more than a packed row of 4; pass truncate=True"),
        ([np.zeros((2, 2))], "record 0: 'tokens' must be a 1-D sequence of tokens"),
        ([{"a": [1], "b": [1, 2]}], "record 0 has sequences of different lengths"),
        ([{"a": [1]}, {"b": [1]}], "record 1 has keys ['b'], record 0 has ['a']"),
        ([{"segment_ids": [1]}], "record 0 has a key 'segment_ids', which packing adds itself"),
    ],
)
def test_bad_records_are_named(records: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Packer(4)(records)


def test_errors_name_records_by_the_indices_given() -> None:
    with pytest.raises(ValueError, match="record 41 has 5 tokens"):
        Packer(4)([[1], list(range(5))], indices=[40, 41])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length": 0}, "length must be >= 1"),
        ({"length": 4, "pad_value": "x"}, "pad_value must be a number"),
        ({"length": 4, "truncate": 1}, "truncate must be a bool"),
    ],
)
def test_bad_options_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Packer(**kwargs)
