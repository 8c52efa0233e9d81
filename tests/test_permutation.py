"""Tests for loadax/permutation.py: keyed bijections of [0, n) and per-record generators."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax.plan.permutation import KeyPurpose, derive_key, permute, record_rng

# Powers of two +-1 bracket binary domains, squares and k*(k+1) +-1 bracket mixed-radix ones
# (a domain of a*b just above n); 2**16 is the block size of `permute`, so sizes past it exercise
# more than one block.
_ROOTS = (2, 3, 4, 5, 7, 10, 16, 31, 100, 255, 256, 257, 1000)
EDGE_SIZES = sorted(
    {0, 1, 2, 3}
    | {2**k + d for k in range(1, 18) for d in (-1, 0, 1)}
    | {k * k + d for k in _ROOTS for d in (-1, 0, 1)}
    | {k * (k + 1) + d for k in _ROOTS for d in (-1, 0, 1)}
)


def _key(
    seed: int = 0, epoch: int = 0, purpose: KeyPurpose = KeyPurpose.PLAN_SHUFFLE
) -> np.ndarray:
    return derive_key(purpose, seed, epoch)


def _permutation(n: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    return permute(np.arange(n, dtype=np.int64), n, _key(seed, epoch))


def _assert_is_permutation_of_range(values: np.ndarray, n: int) -> None:
    assert values.dtype == np.int64
    assert values.shape == (n,)
    np.testing.assert_array_equal(np.sort(values), np.arange(n))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(min_value=0, max_value=5000), seed=st.integers(0, 2**32))
def test_permute_is_a_bijection_of_the_range(n: int, seed: int) -> None:
    _assert_is_permutation_of_range(_permutation(n, seed), n)


@pytest.mark.parametrize("n", EDGE_SIZES)
def test_permute_is_a_bijection_at_edge_sizes(n: int) -> None:
    _assert_is_permutation_of_range(_permutation(n, seed=7, epoch=3), n)


@pytest.mark.parametrize("n", [2, 3, 10, 1000, 2**16 + 1])
def test_same_key_gives_the_same_permutation_on_every_call(n: int) -> None:
    first = _permutation(n, seed=11, epoch=2)
    second = permute(np.arange(n, dtype=np.int64), n, derive_key(KeyPurpose.PLAN_SHUFFLE, 11, 2))
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("n", [10, 11, 64, 1000])
def test_different_seeds_give_different_permutations(n: int) -> None:
    permutations = {tuple(_permutation(n, seed=seed).tolist()) for seed in range(50)}
    assert len(permutations) == 50


@pytest.mark.parametrize("n", [10, 11, 64, 1000])
def test_different_epochs_give_different_permutations(n: int) -> None:
    permutations = {tuple(_permutation(n, seed=5, epoch=epoch).tolist()) for epoch in range(50)}
    assert len(permutations) == 50


def test_different_purposes_give_different_permutations() -> None:
    n = 100
    positions = np.arange(n, dtype=np.int64)
    results = {
        tuple(permute(positions, n, derive_key(purpose, 3, 0)).tolist()) for purpose in KeyPurpose
    }
    assert len(results) == len(KeyPurpose)


@pytest.mark.parametrize("n", [10, 1000])
def test_permutation_is_not_the_identity(n: int) -> None:
    for seed in range(5):
        assert _permutation(n, seed).tolist() != list(range(n))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(min_value=1, max_value=3000), seed=st.integers(0, 2**32))
def test_permuting_a_subset_equals_the_slice_of_permuting_all(
    data: st.DataObject, n: int, seed: int
) -> None:
    subset = data.draw(st.lists(st.integers(0, n - 1), max_size=50))
    everything = _permutation(n, seed)
    part = permute(np.array(subset, dtype=np.int64), n, _key(seed))
    assert part.tolist() == [int(everything[position]) for position in subset]


def test_permute_keeps_the_shape_of_the_positions() -> None:
    n = 500
    positions = np.arange(24, dtype=np.int64).reshape(4, 6) * 7
    result = permute(positions, n, _key(2))
    assert result.shape == (4, 6)
    np.testing.assert_array_equal(result, _permutation(n, seed=2)[positions])


def test_permute_does_not_modify_its_input() -> None:
    positions = np.arange(100, dtype=np.int64)[::-1].copy()
    permute(positions, 100, _key(1))
    assert positions.tolist() == list(range(99, -1, -1))


def test_permute_of_one_or_no_record_is_the_identity() -> None:
    assert permute(np.array([0], dtype=np.int64), 1, _key(9)).tolist() == [0]
    assert permute(np.array([], dtype=np.int64), 0, _key(9)).tolist() == []


def test_permute_handles_ten_billion_records_on_a_sample() -> None:
    n = 10**10
    rng = np.random.default_rng(0)
    spread = rng.choice(n, size=50_000, replace=False).astype(np.int64)
    positions = np.concatenate([np.arange(50_000, dtype=np.int64), n - 1 - spread])
    positions = np.unique(positions)
    result = permute(positions, n, _key(4, 1))
    assert result.dtype == np.int64
    assert result.min() >= 0
    assert result.max() < n
    assert np.unique(result).size == positions.size
    # Random access holds at this size too: a sub-sample maps to the same targets.
    sub = positions[::97]
    np.testing.assert_array_equal(permute(sub, n, _key(4, 1)), result[::97])


def test_each_value_is_equally_likely_at_the_first_position() -> None:
    n, seeds = 10, 500
    counts = collections.Counter(int(_permutation(n, seed)[0]) for seed in range(seeds))
    assert set(counts) == set(range(n))
    # Expected 50 each, standard deviation about 6.7: the bounds are about +-4.5 sigma.
    assert all(20 <= counts[value] <= 80 for value in range(n)), counts


def test_each_position_is_equally_likely_to_hold_a_given_value() -> None:
    n, seeds = 8, 400
    counts = collections.Counter(
        int(np.flatnonzero(_permutation(n, seed) == 0)[0]) for seed in range(seeds)
    )
    assert set(counts) == set(range(n))
    assert all(20 <= counts[position] <= 80 for position in range(n)), counts


@pytest.mark.parametrize(("n", "seeds"), [(2, 400), (3, 600), (4, 2400)])
def test_every_ordering_of_a_few_records_is_reached_about_equally_often(n: int, seeds: int) -> None:
    counts = collections.Counter(tuple(_permutation(n, seed).tolist()) for seed in range(seeds))
    orderings = set(itertools.permutations(range(n)))
    assert set(counts) == orderings
    expected = seeds / len(orderings)
    # Expected 100 or 200 of each ordering: the bounds are at least 5 standard deviations wide.
    assert all(0.5 * expected <= counts[order] <= 1.5 * expected for order in orderings), counts


def _stream(seed: int, epoch: int, index: int) -> list[int]:
    return [int(x) for x in record_rng(seed, epoch, index).integers(0, 2**62, size=8)]


@pytest.mark.parametrize(("seed", "epoch", "index"), [(0, 0, 0), (3, 1, 7), (2**40, 9, 10**12)])
def test_record_rng_is_a_function_of_its_arguments(seed: int, epoch: int, index: int) -> None:
    assert _stream(seed, epoch, index) == _stream(seed, epoch, index)


def test_record_rng_changes_when_any_argument_changes() -> None:
    arguments = list(itertools.product([0, 1, 2], [0, 1, 2], [0, 1, 2, 10**9]))
    streams = {tuple(_stream(*args)) for args in arguments}
    assert len(streams) == len(arguments)
