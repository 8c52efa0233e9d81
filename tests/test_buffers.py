"""`BufferPool`: a buffer comes back only once nothing refers to it, and free ones are bounded."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import jax
import numpy as np
import pytest

from loadax.buffers import BufferPool
from loadax.wire.codec import ARRAY_ALIGN


def address(view: memoryview | np.ndarray[Any, Any]) -> int:
    """Where the memory of `view` starts (an int: it keeps nothing alive)."""
    start: int = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    return start


def test_a_buffer_nothing_refers_to_is_handed_out_again() -> None:
    pool = BufferPool()
    first = pool.take(1 << 20)
    first[:3] = b"abc"
    where = address(first)
    del first
    again = pool.take(1 << 20)
    assert address(again) == where
    assert pool.kept == 1


@pytest.mark.parametrize(
    "keep",
    [
        lambda view: view,
        lambda view: view[100:200],
        lambda view: view.toreadonly(),
        lambda view: np.frombuffer(view.toreadonly(), dtype=np.float32)[4:].reshape(-1, 4),
        lambda view: np.frombuffer(view, dtype=np.uint8).T[::2],
        lambda view: memoryview(np.frombuffer(view, dtype=np.int64)),
        lambda view: jax.device_put(np.frombuffer(view.toreadonly(), dtype=np.float32)),
    ],
    ids=["view", "slice", "read-only", "decoded-array", "array-of-array", "view-of-array", "jax"],
)
def test_a_buffer_anything_refers_to_is_never_handed_out(keep: Any) -> None:
    pool = BufferPool(spare=4)
    view = pool.take(1 << 16)
    view[:] = bytes(range(256)) * 256
    kept = keep(view)
    snapshot = np.array(kept)
    where = address(view)
    del view
    others = [pool.take(1 << 16) for _ in range(3)]
    assert where not in [address(other) for other in others]
    for other in others:
        other[:] = bytes(1 << 16)  # what the next batches' receives do to their buffers
    np.testing.assert_array_equal(np.array(kept), snapshot)
    del kept, others
    gc.collect()  # jax lets go of a host array at its next computation or collection
    assert where in [address(view) for view in [pool.take(1 << 16) for _ in range(4)]]


def test_beyond_those_in_use_at_most_spare_free_buffers_are_kept() -> None:
    pool = BufferPool(spare=2)
    held = [pool.take(1000) for _ in range(6)]
    assert pool.kept == 6
    in_use = held[:2]
    del held
    pool.take(1000)
    assert pool.kept == 2 + 1 + 2  # in use, the one just taken, the spares
    del in_use
    pool.take(1000)
    assert pool.kept == 1 + 2


def test_free_buffers_beyond_spare_bytes_are_let_go() -> None:
    size = 1 << 16  # each allocated 1/8 larger: 72 KiB
    pool = BufferPool(spare=4, spare_bytes=100_000)
    held = [pool.take(size) for _ in range(4)]
    assert pool.kept == 4
    del held
    pool.take(size)
    assert pool.kept == 1 + 1  # the one reused, and the one spare that fits in 100,000 bytes
    unbounded = BufferPool(spare=4)
    held = [unbounded.take(size) for _ in range(4)]
    del held
    unbounded.take(size)
    assert unbounded.kept == 1 + 3


def test_a_free_buffer_is_reused_only_for_between_half_and_all_of_its_length() -> None:
    pool = BufferPool(spare=4)
    where = address(pool.take(1 << 20))  # allocated 1/8 larger: slightly larger batches fit
    assert address(pool.take((1 << 20) + 1000)) == where
    assert address(pool.take(1 << 18)) != where  # too small: would waste most of it
    assert address(pool.take(1 << 21)) != where  # too large
    assert address(pool.take(600_000)) == where


def test_buffers_are_writable_and_exactly_the_size_asked_for() -> None:
    pool = BufferPool()
    for size in (0, 1, 4095, 1 << 20):
        view = pool.take(size)
        assert (len(view), view.readonly, view.format) == (size, False, "B")


@pytest.mark.parametrize("size", [1 << 10, (1 << 20) + 8, 40 << 20])
def test_jax_uses_an_array_decoded_from_a_buffer_in_place(size: int) -> None:
    # Its start is aligned as jax's CPU backend needs to alias a host array, not copy it.
    pool = BufferPool()
    view = pool.take(size)
    assert address(view) % ARRAY_ALIGN == 0
    on_device = jax.device_put(np.frombuffer(view.toreadonly(), dtype=np.float32))
    assert on_device.unsafe_buffer_pointer() == address(view)


def test_threads_never_share_a_buffer() -> None:
    pool = BufferPool()
    failures: list[str] = []

    def hold_and_check(seed: int) -> None:
        for round_ in range(200):
            view = pool.take(4096 + seed)
            pattern = bytes([(seed + round_) % 256]) * len(view)
            view[:] = pattern
            time.sleep(0)  # let the other threads take theirs meanwhile
            if bytes(view) != pattern:
                failures.append(f"thread {seed} round {round_}: another thread wrote its buffer")

    threads = [threading.Thread(target=hold_and_check, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="spare must be an int >= 0, got -1"):
        BufferPool(spare=-1)
    with pytest.raises(ValueError, match="spare_bytes must be None or an int >= 0, got -2"):
        BufferPool(spare_bytes=-2)
    with pytest.raises(ValueError, match="size >= 0, got -5"):
        BufferPool().take(-5)
