"""Buffers reused once nothing refers to them, so that a steady stream of batches neither allocates
nor page-faults a fresh whole-batch buffer per batch: the remote client receives batches into them,
and collation stacks large leaves into them.

A fresh buffer of tens of MiB is memory the kernel maps on first touch, one fault per 4 KiB
page (and glibc maps anything above 32 MiB afresh for every allocation), and that costs more than
the copy that fills it. A reused one is already mapped.

Each buffer starts at a multiple of the codec's `ARRAY_ALIGN` bytes, as the codec aligns a batch's
arrays within it, so that `jax.device_put` uses an array decoded from it in place: jax's CPU
backend copies a host array that is not 64-byte aligned (malloc's large blocks start 16 bytes into
a page).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TypeAlias

import numpy as np

from loadax.wire.codec import ARRAY_ALIGN

_Buffer: TypeAlias = np.ndarray[Any, np.dtype[np.uint8]]
_PAGE = 4096
_GROWTH = 8  # a buffer is allocated 1/8 larger than asked, so that slightly larger batches fit


class BufferPool:
    """Hands out writable buffers to receive or stack batches into, and takes each back once
    nothing refers to it any more.

    `take(size)` gives a writable `memoryview` of `size` bytes: a view of a uint8 numpy array
    that the pool keeps. Whatever is made from it (slices, read-only views, numpy arrays
    decoded from it, a `jax.Array` put from those, as jax keeps the host array it is given)
    holds a reference to that array, directly or through the views between them; so the pool
    knows an array is free when its reference count is the pool's own. It looks when a buffer
    is next needed, not by callbacks: one `sys.getrefcount` per kept buffer, under a lock, so
    `take` is safe from any thread. A buffer is never written again while a batch decoded from
    it is alive, however long its user holds it.

    Bounded: beyond the buffers in use, at most `spare` free ones are kept (the fittest), of at
    most `spare_bytes` together if given; the others are let go. A free buffer is reused for a
    size between half its length and its length (so that a reused buffer holds at most twice
    the memory asked for); otherwise a new one is allocated, 1/8 larger than asked, so that
    slightly larger batches fit it too (pages never written cost no memory).
    """

    def __init__(self, spare: int = 1, spare_bytes: int | None = None) -> None:
        if not (isinstance(spare, int) and spare >= 0):
            raise ValueError(f"spare must be an int >= 0, got {spare!r}")
        if spare_bytes is not None and not (isinstance(spare_bytes, int) and spare_bytes >= 0):
            raise ValueError(f"spare_bytes must be None or an int >= 0, got {spare_bytes!r}")
        self._spare = spare
        self._spare_bytes = spare_bytes
        self._lock = threading.Lock()
        # Each kept buffer with the offset of its aligned start (computed once: asking an
        # array for its address costs more than the rest of a `take`).
        self._buffers: list[tuple[_Buffer, int]] = []

    def take(self, size: int) -> memoryview:
        """A writable buffer of `size` bytes: a free one that fits, else a new one."""
        if size < 0:
            raise ValueError(f"a buffer has a size >= 0, got {size}")
        with self._lock:
            free: list[tuple[_Buffer, int]] = []
            in_use: list[tuple[_Buffer, int]] = []
            for index in range(len(self._buffers)):
                free_now = _references(self._buffers, index) == _FREE
                (free if free_now else in_use).append(self._buffers[index])
            free.sort(key=lambda kept: abs(_usable(kept) - size))  # the fittest first
            fits = [kept for kept in free if size <= _usable(kept) <= 2 * size]
            chosen = (
                fits[0] if fits else _aligned(np.empty(_rounded(size + size // _GROWTH), np.uint8))
            )
            spares = self._spares([kept for kept in free if kept is not chosen])
            self._buffers = [*in_use, *spares, chosen]
            buffer, start = chosen
            return buffer[start : start + size].data

    def _spares(self, free: list[tuple[_Buffer, int]]) -> list[tuple[_Buffer, int]]:
        """The first of the `free` buffers (fittest first) that `spare` and `spare_bytes` allow."""
        kept: list[tuple[_Buffer, int]] = []
        total = 0
        for buffer in free[: self._spare]:
            total += len(buffer[0])
            if self._spare_bytes is not None and total > self._spare_bytes:
                break
            kept.append(buffer)
        return kept

    @property
    def kept(self) -> int:
        """How many buffers the pool keeps, in use or free."""
        with self._lock:
            return len(self._buffers)


def _references(buffers: list[tuple[_Buffer, int]], index: int) -> int:
    """The reference count of the array `buffers[index]` keeps, as `take` sees it."""
    return sys.getrefcount(buffers[index][0])


# What a kept buffer that nothing else refers to counts: the pool's entry's reference and the
# call's own. Measured the same way, so that it holds whatever the interpreter counts.
_FREE = _references([(np.empty(0, dtype=np.uint8), 0)], 0)


def _rounded(size: int) -> int:
    """`size` and room to align its start, rounded up to whole pages."""
    return -(-(size + ARRAY_ALIGN) // _PAGE) * _PAGE


def _aligned(buffer: _Buffer) -> tuple[_Buffer, int]:
    """`buffer` and the offset in it of its first byte at a multiple of `ARRAY_ALIGN`."""
    address: int = buffer.ctypes.data
    return buffer, -address % ARRAY_ALIGN


def _usable(kept: tuple[_Buffer, int]) -> int:
    """How many bytes of a kept buffer are handed out from its aligned start on."""
    buffer, start = kept
    return len(buffer) - start
