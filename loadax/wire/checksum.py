"""The checksum of a batch's payload: what the worker sends in a reply's header and the client
recomputes over the bytes it received, of one of three kinds (`wire.Checksum`, named in the header).

XXH3 (64 bits, the `xxhash` package, installed with the `fast` extra) runs at about 32 GB/s over a
batch out of the CPU's caches here and 57 GB/s over 1 MiB in them, which is where the transports
compute it: as each frame or message of a payload is received, and, on the worker, as each piece
is written (`new_hasher` takes the bytes in pieces).

XXH3 in chunks (`wire.CHECKSUM_XXH3_CHUNKS`): XXH3 of each `CHUNK_BYTES` of the payload, then
XXH3 of those digests in order (uint64, little-endian). Its chunks can be hashed in any order,
by any thread (`ChunkDigests`): a worker's loading threads, which stack the rows of every leaf
of a batch in parallel, each hash the chunks they complete while the bytes are in their cache,
where one XXH3 over the stacked batch reads it back from memory at a third of the speed (38.5 MB
hashed cold 16 GB/s here, a 256 KiB chunk in the cache 61). Received in pieces it is the same
value (`new_hasher`), so that every transport checks it as the bytes land.

A client asks for the best kind it has (`PREFERRED`: XXH3 in chunks with `xxhash`); a worker
that lacks it (without `xxhash`, or older) answers the weighted sums below, which every loadax
has, and says so in the header, so that peers of any kind, old ones included, agree.

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

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from loadax.wire.v1 import worker_pb2 as wire


def _without_xxhash(*_: object) -> Any:
    raise ValueError("this process cannot compute XXH3 (install loadax[fast] for xxhash)")


_xxh3_64: Callable[..., Any]
_xxh3_digest: Callable[[Any], int]
try:
    from xxhash import xxh3_64 as _xxh3_64
    from xxhash import xxh3_64_intdigest as _xxh3_digest
except ImportError:  # the optional `fast` extra is not installed
    _xxh3_64 = _xxh3_digest = _without_xxhash

XXH3_AVAILABLE = _xxh3_digest is not _without_xxhash
"""Whether this process can compute the XXH3 kinds (the `xxhash` package is installed)."""
_XXH3_KINDS = (wire.CHECKSUM_XXH3_64, wire.CHECKSUM_XXH3_CHUNKS)
PREFERRED = wire.CHECKSUM_XXH3_CHUNKS if XXH3_AVAILABLE else wire.CHECKSUM_WEIGHTED_SUM
"""The checksum a client asks for: the best this process has."""
CHUNK_BYTES = 256 << 10
"""The chunks of `wire.CHECKSUM_XXH3_CHUNKS`: small enough to stay in a core's cache (1 MiB of
L2 here) between being written and hashed, large enough that a call per chunk costs little
(a 38.5 MB batch is 147 chunks)."""

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
    return kind == wire.CHECKSUM_WEIGHTED_SUM or (kind in _XXH3_KINDS and XXH3_AVAILABLE)


def kind_name(kind: int) -> str:
    """The name of `kind` (a `wire.Checksum`), or its number if it has none."""
    return wire.Checksum.Name(kind) if kind in wire.Checksum.values() else str(kind)


def new_hasher(kind: int) -> Hasher:
    """A `Hasher` of `kind`; a ValueError naming it if this process cannot compute it."""
    if kind == wire.CHECKSUM_WEIGHTED_SUM:
        return _BlockSums()
    if kind == wire.CHECKSUM_XXH3_64 and XXH3_AVAILABLE:
        return _Xxh3(_xxh3_64())
    if kind == wire.CHECKSUM_XXH3_CHUNKS and XXH3_AVAILABLE:
        return _Xxh3Chunks()
    raise ValueError(
        f"this process cannot compute the checksum {kind_name(kind)}"
        + (" (install loadax[fast] for xxhash)" if kind in _XXH3_KINDS else "")
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


class _Xxh3Chunks:
    """XXH3 in chunks of the pieces joined: a chunk inside a piece is hashed in place, one that
    spans pieces through a streaming state (no copy)."""

    def __init__(self) -> None:
        self._digests: list[int] = []
        self._partial: Any = None  # the XXH3 state of a chunk begun in an earlier piece
        self._filled = 0  # its bytes so far

    def update(self, piece: memoryview) -> None:
        if self._filled:
            taken = min(CHUNK_BYTES - self._filled, len(piece))
            self._partial.update(piece[:taken])
            self._filled += taken
            piece = piece[taken:]
            if self._filled < CHUNK_BYTES:
                return
            self._digests.append(self._partial.intdigest())
            self._filled = 0
        whole = len(piece) - len(piece) % CHUNK_BYTES
        self._digests += [
            _xxh3_digest(piece[at : at + CHUNK_BYTES]) for at in range(0, whole, CHUNK_BYTES)
        ]
        if whole < len(piece):
            self._partial = _xxh3_64(piece[whole:])
            self._filled = len(piece) - whole

    def value(self) -> int:
        if self._filled:
            self._digests.append(self._partial.intdigest())
            self._filled = 0
        return _joined(self._digests)


class ChunkDigests:
    """`wire.CHECKSUM_XXH3_CHUNKS` of the first `size` bytes of `data`, written in parts, in any
    order and from any thread: each part is declared `written` once final, and a chunk is hashed
    as soon as all of its bytes are, by the thread whose part completed it (while they are in
    its cache); `value` hashes the chunks never completed (bytes written without a word) and
    joins the digests. Each byte must be declared once at most: a chunk is complete when as many
    bytes of it were declared as it holds."""

    def __init__(self, data: np.ndarray[Any, np.dtype[np.uint8]], size: int) -> None:
        if not XXH3_AVAILABLE:
            raise ValueError(
                f"this process cannot compute the checksum {kind_name(wire.CHECKSUM_XXH3_CHUNKS)} "
                "(install loadax[fast] for xxhash)"
            )
        self.size = size
        self._data = data
        count = -(-size // CHUNK_BYTES)
        self._left = [CHUNK_BYTES] * count  # bytes of each chunk not declared yet
        if count:
            self._left[-1] = size - (count - 1) * CHUNK_BYTES
        self._digests: list[int | None] = [None] * count
        self._lock = threading.Lock()

    def written(self, start: int, stop: int) -> None:
        """Bytes `start` to `stop` of the payload are final: hash the chunks that completes."""
        if not 0 <= start <= stop <= self.size:
            raise ValueError(f"bytes {start} to {stop} are not within a payload of {self.size}")
        complete = []
        with self._lock:
            for chunk in range(start // CHUNK_BYTES, -(-stop // CHUNK_BYTES)):
                low = max(start, chunk * CHUNK_BYTES)
                self._left[chunk] -= min(stop, low - low % CHUNK_BYTES + CHUNK_BYTES) - low
                if self._left[chunk] == 0:
                    complete.append(chunk)
        for chunk in complete:
            self._digests[chunk] = self._chunk(chunk)

    def value(self) -> int:
        """The checksum, once every byte is written (once: it ends the computation)."""
        return _joined(
            [self._chunk(at) if made is None else made for at, made in enumerate(self._digests)]
        )

    def _chunk(self, chunk: int) -> int:
        start = chunk * CHUNK_BYTES
        return _xxh3_digest(self._data[start : min(start + CHUNK_BYTES, self.size)])


def _joined(digests: list[int]) -> int:
    """XXH3 of `digests` (each a chunk's XXH3) in order, as little-endian uint64 words."""
    return _xxh3_digest(np.array(digests, dtype=_WORD))


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
