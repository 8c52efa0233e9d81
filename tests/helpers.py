"""Shared test helpers: batch equality and the restore-at-every-step checkpoint check."""

from __future__ import annotations

import gc
import json
import random
import threading
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from loadax import Loader
from loadax.iterators.passes import RepeatedEpochWarning


def assert_batches_equal(actual: Iterable[Any], expected: Iterable[Any]) -> None:
    """Equal pytrees of arrays (or plain values), batch by batch, and the same count."""
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), f"{len(actual)} batches, expected {len(expected)}"
    for step, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert jax.tree.structure(got) == jax.tree.structure(want), f"step {step}"
        for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(got_leaf, want_leaf, err_msg=f"step {step}")


def assert_equal_output_after_checkpoint(loader: Loader[Any]) -> None:
    """Restoring the state saved before any step yields exactly the rest of an undisturbed run."""
    with warnings.catch_warnings():
        # Its reference run may be the loader's second full pass, on purpose.
        warnings.simplefilter("ignore", RepeatedEpochWarning)
        expected = list(loader)
    iterator = iter(loader)
    states = [iterator.get_state()]
    for _ in expected:
        next(iterator)
        states.append(iterator.get_state())
    for step, state in enumerate(states):
        assert state["step"] == step
        restored = iter(loader)
        restored.set_state(json.loads(json.dumps(state)))
        assert_batches_equal(restored, expected[step:])
    # Restoring an iterator that has run ahead rewinds it.
    iterator.set_state(states[0])
    assert_batches_equal(iterator, expected)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loadax")]


def join_loader_threads() -> list[threading.Thread]:
    """Collect abandoned iterators, wait for loadax threads to end, return any still alive."""
    gc.collect()
    for thread in loader_threads():
        thread.join(timeout=10)
    return loader_threads()


class CountingSource:
    """A foreign dataset whose batched reads are logged."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.batches: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        raise AssertionError("a batched read fell back to __getitem__")

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self.batches.append(list(indices))
        return [self.items[index] for index in indices]


def assert_records_equal(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for position, (record, expected) in enumerate(zip(got, want, strict=True)):
        assert list(record) == list(expected), f"record {position}"
        for name, value in expected.items():
            assert np.asarray(record[name]).dtype == np.asarray(value).dtype, (position, name)
            np.testing.assert_array_equal(record[name], value, err_msg=f"{position} {name}")


def assert_concurrent_reads_are_right(dataset: Any, expected: list[dict[str, Any]]) -> None:
    """16 tasks on 8 threads read random batches (negative indices too) and get the right rows."""
    size = len(expected)

    def read(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(40):
            indices = [rng.randrange(-size, size) for _ in range(rng.randrange(1, 12))]
            assert_records_equal(
                dataset.__getitems__(indices), [expected[index] for index in indices]
            )

    with ThreadPoolExecutor(8) as pool:
        for outcome in [pool.submit(read, seed) for seed in range(16)]:
            outcome.result()
