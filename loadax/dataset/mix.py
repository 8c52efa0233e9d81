"""A weighted mixture of datasets with exact proportions in every window, still random-access.

The records are cut into windows of `window` records. Window j holds exactly `counts[k]` records
of dataset k, at positions given by a keyed permutation of (seed, j); within a window, dataset k's
records are its records `j * counts[k]` onwards, in order. So record i of the mixture is a pure
function of i, and any index can be read without reading the ones before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeVar

from loadax.dataset.names import dataset_repr
from loadax.dataset.ops import ConcatenatedDataset, DatasetBase
from loadax.dataset.protocol import Dataset, as_datasets, dataset_lengths
from loadax.plan.permutation import IndexArray, KeyPurpose, derive_key, permute
from loadax.validation import is_number, require_int

T = TypeVar("T", default=Any)

# The stream of the window layouts; KeyPurpose.MIX once that member exists.
# Without an explicit window, the smallest window up to this size with exact counts, else this.
DEFAULT_WINDOW = 1000
_TOLERANCE = 1e-9


def window_counts(weights: Sequence[float], window: int | None = None) -> tuple[int, ...]:
    """How many records of each dataset one window holds; they sum to the window size.

    Without `window`, the smallest window (up to `DEFAULT_WINDOW`) in which every normalised
    weight times the window is an integer >= 1; if there is none, `DEFAULT_WINDOW` records
    split by largest-remainder rounding. A dataset whose count would be 0 is an error.
    """
    total = math.fsum(weights)
    shares = [weight / total for weight in weights]
    if window is None:
        for size in range(len(shares), DEFAULT_WINDOW + 1):
            counts = [round(share * size) for share in shares]
            exact = all(
                abs(c - s * size) <= _TOLERANCE * size for c, s in zip(counts, shares, strict=True)
            )
            if exact and min(counts) >= 1 and sum(counts) == size:
                return tuple(counts)
        window = DEFAULT_WINDOW
    # Largest remainders, with exact rational arithmetic so that ties break the same everywhere.
    ideal = [Fraction(share) * window for share in shares]
    counts = [math.floor(value) for value in ideal]
    by_remainder = sorted(range(len(ideal)), key=lambda k: (-(ideal[k] - counts[k]), k))
    for k in by_remainder[: window - sum(counts)]:
        counts[k] += 1
    for k, count in enumerate(counts):
        if count < 1:
            raise ValueError(
                f"weights[{k}] = {weights[k]!r} gives dataset {k} no record in a window of "
                f"{window}; pass a larger window"
            )
    return tuple(counts)


class MixedDataset(DatasetBase[T]):
    """Records of `datasets` interleaved in proportion to `weights`, exactly in every window.

    Record i lies in window `i // window`; that window holds `counts[k]` records of dataset k
    (see `window_counts`) in an order keyed by (seed, window index), the same in every epoch;
    the epoch passes through to the datasets. The mixture ends at the first exhausted dataset:
    its length is `min_k(len_k // counts[k]) * window`, so records past the last whole window
    that every dataset can fill are never read. Being random-access, it checkpoints with the
    plan's step like any other dataset.

    >>> from loadax import MixedDataset
    >>> mixed = MixedDataset([["a"] * 6, ["b"] * 3], weights=[2, 1], seed=0)
    >>> mixed.counts, mixed.window, len(mixed)
    ((2, 1), 3, 9)
    >>> "".join(mixed)  # each window of 3 holds two "a" and one "b"
    'ababaaaab'
    >>> from loadax import RangeDataset
    >>> MixedDataset([RangeDataset(0, 6), RangeDataset(10, 13)], weights=[0.6, 0.3])
    MixedDataset([RangeDataset(0, 6), RangeDataset(10, 13)], weights=[2, 1], seed=0, window=3)
    """

    def __init__(
        self,
        datasets: Sequence[Dataset[T]],
        weights: Sequence[float],
        seed: int | None = None,
        window: int | None = None,
    ) -> None:
        self._datasets = as_datasets(datasets)
        lengths = dataset_lengths(self._datasets)
        weights = tuple(weights)
        if len(weights) != len(self._datasets):
            raise ValueError(
                f"weights has {len(weights)} entries but there are {len(self._datasets)} datasets"
            )
        for position, weight in enumerate(weights):
            if not is_number(weight):
                raise ValueError(f"weights[{position}] must be a number, got {weight!r}")
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"weights[{position}] must be positive and finite, got {weight!r}")
        if window is not None:
            window = require_int("window", window, minimum=len(self._datasets))
        self._seed = 0 if seed is None else require_int("seed", seed, minimum=0)
        self._counts = np.array(window_counts(weights, window), dtype=np.int64)
        self._window = int(self._counts.sum())
        # Dataset k fills positions [_slot_starts[k], +counts[k]) of a window before permuting.
        self._slot_ends = np.cumsum(self._counts)
        self._slot_starts = self._slot_ends - self._counts
        self._windows = min(
            length // int(count) for length, count in zip(lengths, self._counts, strict=True)
        )
        self._joined = ConcatenatedDataset(self._datasets)
        self._offsets = np.cumsum(np.array([0, *lengths[:-1]], dtype=np.int64))

    @property
    def counts(self) -> tuple[int, ...]:
        """The records of each dataset in one window."""
        return tuple(self._counts.tolist())

    @property
    def window(self) -> int:
        """The records in one window."""
        return self._window

    def __len__(self) -> int:
        return self._windows * self._window

    def __repr__(self) -> str:
        # A window's counts as weights, with the window, give exactly this mixture.
        datasets = ", ".join(map(dataset_repr, self._datasets))
        return (
            f"MixedDataset([{datasets}], weights={list(self.counts)}, seed={self._seed}, "
            f"window={self._window})"
        )

    def _parents(self) -> tuple[Dataset[Any], ...]:
        return self._datasets

    def read(self, indices: IndexArray, epoch: int) -> list[T]:
        if len(indices) == 0:
            return []
        windows, positions = np.divmod(indices, self._window)
        unique, which = np.unique(windows, return_inverse=True)
        owners = np.empty((len(unique), self._window), dtype=np.int64)
        ranks = np.empty_like(owners)
        for row, window in enumerate(unique.tolist()):
            owners[row], ranks[row] = self._layout(window)
        owner = owners[which, positions]
        local = windows * self._counts[owner] + ranks[which, positions]
        # One ConcatenatedDataset read: each dataset is read once, with the epoch passed through.
        return self._joined.read(self._offsets[owner] + local, epoch)

    def _layout(self, window: int) -> tuple[IndexArray, IndexArray]:
        """Which dataset owns each position of `window`, and its rank among that dataset's."""
        key = derive_key(KeyPurpose.MIX, self._seed, window)
        slots = permute(np.arange(self._window, dtype=np.int64), self._window, key)
        owners: IndexArray = np.searchsorted(self._slot_ends, slots, side="right")
        # A stable sort keeps positional order within each dataset's group of slots.
        order = np.argsort(owners, kind="stable")
        ranks: npt.NDArray[np.int64] = np.empty(self._window, dtype=np.int64)
        ranks[order] = np.arange(self._window, dtype=np.int64) - self._slot_starts[owners[order]]
        return owners, ranks
