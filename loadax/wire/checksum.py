"""The checksum of a batch's payload: what the worker sends in a reply's header and the client
recomputes over the bytes it received, of one of two kinds (`wire.Checksum`, named in the header).

XXH3 (64 bits, the `xxhash` package, installed with the `fast` extra) runs at about 32 GB/s over a
batch out of the CPU's caches here and 57 GB/s over 1 MiB in them, which is where the transports
compute it: as each frame or message of a payload is received, and, on the worker, as each piece
is written (`new_hasher` takes the bytes in pieces). A client asks for it when it has `xxhash`
(`PREFERRED`); a worker without it answers the weighted sums below, which every loadax has, and
says so in the header, so that peers of either kind, old ones included, agree.

The weighted sums: it must cost little next to the batch itself, on both ends: zlib's CRC-32
and Adler-32 run at 3 to 4 GB/s, 10 to 14 ms for a W2 batch of 38.5 MB, a fifth to a quarter of
a remote (R1) batch's time. So it is a position-weighted sum of little-endian uint64 words,
which numpy computes at 17 to 20 GB/s, about 2 ms a W2 batch, with the GIL released
(`benchmarks/checksum_bench.py` measures them all). The payload is cut into blocks of 8 KiB;
each block's words are weighted by odd constants (one per position in a block) and summed, and
the blocks' sums by odd weights again (one per block), all modulo 2**64; the length is folded
in last. The weights are what tells two swapped labels apart; a plain sum would be a third
cheaper and miss that.

What it catches: any change of one word (every single-bit and single-byte error), a truncated
or extended payload, frames in the wrong order, and all but a vanishing share of other changes.
It is an error check, not a MAC: whoever can change a payload can recompute its checksum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from loadax.wire.v1 import worker_pb2 as wire

_xxh3_64: Callable[[], Any] | None
try:
    from xxhash import xxh3_64 as _xxh3_64
except ImportError:  # the optional `fast` extra is not installed
    _xxh3_64 = None

XXH3_AVAILABLE = _xxh3_64 is not None
"""Whether this process can compute `wire.CHECKSUM_XXH3_64` (the `xxhash` package is installed)."""
PREFERRED = wire.CHECKSUM_XXH3_64 if XXH3_AVAILABLE else wire.CHECKSUM_WEIGHTED_SUM
"""The checksum a client asks for: the fastest this process has."""

_WORD = np.dtype("<u8")
_WORDS = 1024
_BLOCK = _WORD.itemsize * _WORDS
# Odd (2j + 1 times an odd constant): a change of one word always changes the sum.
_WEIGHTS = (np.arange(_WORDS, dtype=_WORD) * 2 + 1) * np.uint64(0x9E3779B97F4A7C15)
_LENGTH_WEIGHT = 0xC2B2AE3D27D4EB4F
_MASK = 2**64 - 1


class Hasher(Protocol):
    """A checksum computed over bytes given in pieces, in order."""

    def update(self, piece: memoryview) -> None: ...

    def value(self) -> int:
        """The checksum of every piece so far, joined (once: it ends the computation)."""
        ...


def available(kind: int) -> bool:
    """Whether this process can compute the checksum `kind` (a `wire.Checksum`)."""
    return kind == wire.CHECKSUM_WEIGHTED_SUM or (kind == wire.CHECKSUM_XXH3_64 and XXH3_AVAILABLE)


def kind_name(kind: int) -> str:
    """The name of `kind` (a `wire.Checksum`), or its number if it has none."""
    return wire.Checksum.Name(kind) if kind in wire.Checksum.values() else str(kind)


def new_hasher(kind: int) -> Hasher:
    """A `Hasher` of `kind`; a ValueError naming it if this process cannot compute it."""
    if kind == wire.CHECKSUM_WEIGHTED_SUM:
        return _BlockSums()
    if kind == wire.CHECKSUM_XXH3_64 and _xxh3_64 is not None:
        return _Xxh3(_xxh3_64())
    raise ValueError(
        f"this process cannot compute the checksum {kind_name(kind)}"
        + (" (install loadax[fast] for xxhash)" if kind == wire.CHECKSUM_XXH3_64 else "")
    )


def payload_checksum(
    frames: Iterable[bytes | bytearray | memoryview], kind: int = wire.CHECKSUM_WEIGHTED_SUM
) -> int:
    """The checksum `kind` of the bytes of `frames` joined, without joining them: it depends on
    those bytes alone, not on how they are cut into frames.

    >>> from loadax.wire.checksum import payload_checksum
    >>> payload_checksum([b"abc", b"def"]) == payload_checksum([b"abcdef"])
    True
    >>> payload_checksum([b"abcdef"]) == payload_checksum([b"abcdeg"])
    False
    """
    hasher = new_hasher(kind)
    for frame in frames:
        hasher.update(memoryview(frame).cast("B"))
    return hasher.value()


class _Xxh3:
    """XXH3 (64 bits) of the pieces joined."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def update(self, piece: memoryview) -> None:
        self._state.update(piece)

    def value(self) -> int:
        value: int = self._state.intdigest()
        return value


class _BlockSums:
    """The weighted sum of each whole block seen so far; a block that spans frames is copied
    together (at most one block per frame boundary), every other block is read in place."""

    def __init__(self) -> None:
        self._sums: list[np.ndarray[Any, np.dtype[np.uint64]]] = []
        self._partial = bytearray()
        self._length = 0

    def update(self, view: memoryview) -> None:
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

    def value(self) -> int:
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
