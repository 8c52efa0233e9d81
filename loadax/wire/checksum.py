"""The checksum of a batch's payload: what the worker sends in a reply's header and the client
recomputes over the bytes it received.

It must cost little next to the batch itself, on both ends: zlib's CRC-32 and Adler-32 run at 3
to 4 GB/s, 10 to 14 ms for a W2 batch of 38.5 MB, a fifth to a quarter of a remote (R1) batch's
time. So it is a position-weighted sum of little-endian uint64 words, which numpy computes at
17 to 20 GB/s, about 2 ms a W2 batch, with the GIL released (`benchmarks/checksum_bench.py`
measures them all). The payload is cut into blocks of 8 KiB; each block's words are weighted by
odd constants (one per position in a block) and summed, and the blocks' sums by odd weights
again (one per block), all modulo 2**64; the length is folded in last. The weights are what
tells two swapped labels apart; a plain sum would be a third cheaper and miss that.

What it catches: any change of one word (every single-bit and single-byte error), a truncated
or extended payload, frames in the wrong order, and all but a vanishing share of other changes.
It is an error check, not a MAC: whoever can change a payload can recompute its checksum.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

_WORD = np.dtype("<u8")
_WORDS = 1024
_BLOCK = _WORD.itemsize * _WORDS
# Odd (2j + 1 times an odd constant): a change of one word always changes the sum.
_WEIGHTS = (np.arange(_WORDS, dtype=_WORD) * 2 + 1) * np.uint64(0x9E3779B97F4A7C15)
_LENGTH_WEIGHT = 0xC2B2AE3D27D4EB4F
_MASK = 2**64 - 1


def payload_checksum(frames: Iterable[bytes | bytearray | memoryview]) -> int:
    """The checksum of the bytes of `frames` joined, without joining them: it depends on those
    bytes alone, not on how they are cut into frames.

    >>> from loadax.wire.checksum import payload_checksum
    >>> payload_checksum([b"abc", b"def"]) == payload_checksum([b"abcdef"])
    True
    >>> payload_checksum([b"abcdef"]) == payload_checksum([b"abcdeg"])
    False
    """
    sums = _BlockSums()
    for frame in frames:
        sums.add(memoryview(frame).cast("B"))
    return sums.checksum()


class _BlockSums:
    """The weighted sum of each whole block seen so far; a block that spans frames is copied
    together (at most one block per frame boundary), every other block is read in place."""

    def __init__(self) -> None:
        self._sums: list[np.ndarray[Any, np.dtype[np.uint64]]] = []
        self._partial = bytearray()
        self._length = 0

    def add(self, view: memoryview) -> None:
        self._length += len(view)
        if self._partial:
            taken = min(_BLOCK - len(self._partial), len(view))
            self._partial += view[:taken]
            view = view[taken:]
            if len(self._partial) < _BLOCK:
                return
            self._blocks(memoryview(self._partial))
            self._partial = bytearray()
        whole = len(view) - len(view) % _BLOCK
        if whole:
            self._blocks(view[:whole])
        self._partial += view[whole:]

    def checksum(self) -> int:
        if self._partial:
            self._blocks(memoryview(self._partial + bytes(_BLOCK - len(self._partial))))
            self._partial = bytearray()
        total = 0
        if self._sums:
            sums = np.concatenate(self._sums)
            block_weights = np.arange(sums.size, dtype=_WORD) * 2 + 1
            total = int(np.sum(sums * block_weights, dtype=_WORD))
        return (total + self._length * _LENGTH_WEIGHT) & _MASK

    def _blocks(self, view: memoryview) -> None:
        words = np.frombuffer(view, dtype=_WORD).reshape(-1, _WORDS)
        self._sums.append(np.einsum("ij,j->i", words, _WEIGHTS))
