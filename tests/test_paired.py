"""Paired ratios of benchmark rounds (benchmarks/paired.py): their median, its interval, the
verdict against a limit."""

from __future__ import annotations

import doctest
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import paired
from paired import Paired


def test_examples_in_the_docstrings_hold() -> None:
    assert doctest.testmod(paired).failed == 0


@pytest.mark.parametrize(("rounds", "rank"), [(6, 1), (8, 1), (9, 2), (12, 3), (17, 5)])
def test_the_interval_is_the_binomial_order_statistics_of_the_median(
    rounds: int, rank: int
) -> None:
    # The textbook ranks (1-based) of the 95 % interval of a median of `rounds` values.
    ratios = Paired(tuple(1 + step / 100 for step in range(rounds)))
    low, high = ratios.interval() or (math.nan, math.nan)
    assert (low, high) == (1 + (rank - 1) / 100, 1 + (rounds - rank) / 100)


def test_too_few_rounds_give_no_interval_and_a_plain_verdict() -> None:
    ratios = Paired((0.9, 1.2, 1.01, 0.95, 1.1))
    assert ratios.interval() is None
    assert ratios.verdict(1.0) == "**missed**"
    assert ratios.describe() == "1.010 (5 rounds)"


def test_each_round_is_divided_by_its_own_partner() -> None:
    # Both sides drift with the load by 30 %; each round's ratio stays within 4-5.3 %.
    ratios = Paired.of([20.0, 24.0, 22.0, 26.0, 21.0, 25.0], [19.0, 23.0, 21.0, 25.0, 20.0, 24.0])
    assert ratios.median == pytest.approx(1.0455, abs=1e-4)
    assert ratios.interval() == (26.0 / 25.0, 20.0 / 19.0)
    assert ratios.verdict(1.02) == "**missed**"


@pytest.mark.parametrize(
    ("numerators", "denominators", "message"),
    [
        ([1.0, 2.0], [1.0], "differ in number: 2 and 1"),
        ([1.0], [0.0], "denominator is zero"),
        ([], [], "at least one round"),
        ([-1.0], [1.0], "not negative"),
    ],
)
def test_bad_rounds_are_refused_with_the_reason(
    numerators: list[float], denominators: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Paired.of(numerators, denominators)
