"""Paired ratios: one measurement over another taken in the same round, and how sure their
median is.

On a shared machine a run's CPU per GB moves by +-20 % with the load of the minute it ran in;
two runs of the same round, next to each other, move together. A round's ratio cancels most of
that, and the median of the rounds' ratios, with its distribution-free interval, says whether a
target a few percent away is met or not yet told apart from it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95
"""How sure the interval around a median is."""


@dataclasses.dataclass(frozen=True, slots=True)
class Paired:
    """The rounds' ratios of one measurement over another (each in the same round).

    >>> ratios = Paired((1.04, 0.98, 1.10, 1.01, 0.97, 1.06, 1.03, 1.00, 1.05))
    >>> ratios.median
    1.03
    >>> ratios.interval()
    (0.98, 1.06)
    >>> ratios.verdict(1.15), ratios.verdict(0.95), ratios.verdict(1.0)
    ('met', '**missed**', '**missed** (not told apart from 1)')
    """

    ratios: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.ratios:
            raise ValueError("Paired needs at least one round's ratio")
        if not all(math.isfinite(ratio) and ratio >= 0 for ratio in self.ratios):
            raise ValueError(f"ratios must be finite and not negative, got {self.ratios}")

    @classmethod
    def of(cls, numerators: Sequence[float], denominators: Sequence[float]) -> Paired:
        """Each round's `numerators[i] / denominators[i]`."""
        if len(numerators) != len(denominators):
            raise ValueError(
                f"paired rounds differ in number: {len(numerators)} and {len(denominators)}"
            )
        if not all(denominators):
            raise ValueError(f"a round's denominator is zero: {list(denominators)}")
        return cls(
            tuple(top / bottom for top, bottom in zip(numerators, denominators, strict=True))
        )

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    def interval(self) -> tuple[float, float] | None:
        """The `CONFIDENCE` interval of the median from the sorted ratios (the binomial order
        statistics: no assumption about their spread); None below 6 rounds, too few for one."""
        n = len(self.ratios)
        # The most ratios `below` that may lie under the interval while it still holds the
        # median with CONFIDENCE: P(Binomial(n, 1/2) <= below) <= (1 - CONFIDENCE) / 2.
        tail, below = 0.0, -1
        while True:
            tail += math.comb(n, below + 1) / 2**n
            if tail > (1 - CONFIDENCE) / 2:
                break
            below += 1
        if below < 0:
            return None
        ordered = sorted(self.ratios)
        return ordered[below], ordered[n - 1 - below]

    def verdict(self, limit: float) -> str:
        """'met' when the median is at most `limit`, else missed; said not told apart from the
        limit when the interval holds it."""
        met = "met" if self.median <= limit else "**missed**"
        interval = self.interval()
        if interval is not None and interval[0] <= limit <= interval[1]:
            return f"{met} (not told apart from {limit:g})"
        return met

    def describe(self) -> str:
        """The median, its interval and the number of rounds, for a table."""
        interval = self.interval()
        spread = (
            f"{CONFIDENCE * 100:.0f} % interval {interval[0]:.3f}-{interval[1]:.3f}, "
            if interval is not None
            else ""
        )
        return f"{self.median:.3f} ({spread}{len(self.ratios)} rounds)"
