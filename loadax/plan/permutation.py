"""Keyed bijective permutations of [0, n), computed per index in O(1) memory and vectorised.

A keyed Feistel network on mixed radices is a bijection on [0, a*b) with a*b just above n; it is
restricted to [0, n) by cycle walking: indices that land outside are permuted again until they
fall inside. Since a*b - n < a ~ sqrt(n), walking is rare.
"""

from __future__ import annotations

import enum
import math

import numpy as np
import numpy.typing as npt

_ROUNDS = 8
_BLOCK = 1 << 16

IndexArray = npt.NDArray[np.int64]


class KeyPurpose(enum.IntEnum):
    """Separates the random streams derived from one user seed."""

    PLAN_SHUFFLE = 1
    DATASET_SHUFFLE = 2
    RECORD_RNG = 3
    MIX = 4
    BUCKET_SHUFFLE = 5
    BUCKET_ORDER = 6
    BLOCK_ORDER = 7
    WINDOW_SHUFFLE = 8
    BLOCK_TAIL = 9


def derive_key(purpose: KeyPurpose, seed: int, epoch: int, *more: int) -> npt.NDArray[np.uint64]:
    """The round keys of the permutation for (purpose, seed, epoch, *more)."""
    sequence = np.random.SeedSequence((int(purpose), seed, epoch, *more))
    return sequence.generate_state(_ROUNDS, dtype=np.uint64).astype(np.uint64)


def record_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator of one record: a function of (seed, epoch, index) only."""
    sequence = np.random.SeedSequence((int(KeyPurpose.RECORD_RNG), seed, epoch, index))
    return np.random.Generator(np.random.PCG64(sequence))


def permute(positions: IndexArray, size: int, key: npt.NDArray[np.uint64]) -> IndexArray:
    """Where each of `positions` (all in [0, size)) goes under the permutation keyed by `key`."""
    if size <= 1:
        return positions.astype(np.int64, copy=True)
    # The domain high_size x low_size is at most ~sqrt(size) larger than size: walking is rare.
    high_size = math.isqrt(size - 1) + 1
    low_size = -(-size // high_size)
    result = np.empty(positions.shape, dtype=np.int64)
    flat_positions, flat_result = positions.reshape(-1), result.reshape(-1)
    # Blocks that stay in cache: the hash is memory-bound on large arrays.
    for start in range(0, flat_positions.size, _BLOCK):
        block = flat_positions[start : start + _BLOCK].astype(np.uint64)
        values = _feistel(block, high_size, low_size, key)
        outside = np.flatnonzero(values >= np.uint64(size))
        while outside.size:
            values[outside] = _feistel(values[outside], high_size, low_size, key)
            outside = outside[values[outside] >= np.uint64(size)]
        flat_result[start : start + _BLOCK] = values
    return result


def _feistel(
    x: npt.NDArray[np.uint64], high_size: int, low_size: int, key: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """A keyed bijection of [0, high_size * low_size): a Feistel network on mixed radices.

    Each round adds a keyed hash of one half to the other, modulo that half's size, and swaps
    the halves (Black and Rogaway's construction for arbitrary finite domains). An even number
    of rounds brings the halves back to their sizes.
    """
    high, low = np.divmod(x, np.uint64(low_size))
    sizes = np.uint64(high_size), np.uint64(low_size)
    mixed, scratch = np.empty_like(x), np.empty_like(x)
    for round_key in key[:_ROUNDS]:
        np.bitwise_xor(low, round_key, out=mixed)
        _mix(mixed, scratch)
        mixed %= sizes[0]
        high += mixed
        high %= sizes[0]
        high, low = low, high
        sizes = sizes[1], sizes[0]
    high *= sizes[1]
    high += low
    return high


def _mix(x: npt.NDArray[np.uint64], scratch: npt.NDArray[np.uint64]) -> None:
    """The splitmix64 finaliser, in place: every output bit depends on every input bit."""
    for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(x, np.uint64(shift), out=scratch)
        x ^= scratch
        x *= np.uint64(multiplier)
    np.right_shift(x, np.uint64(31), out=scratch)
    x ^= scratch
