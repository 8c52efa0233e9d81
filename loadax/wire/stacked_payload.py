"""A batch's payload laid out as it is stacked: the loading threads copy each part's rows into
one buffer at the places the batch's encoding gives its arrays (a `StackInto`), and with XXH3 in
chunks (`wire.CHECKSUM_XXH3_CHUNKS`) each thread hashes the chunks of the payload its rows complete
while they are in its cache (`ChunkDigests`), so that no pass reads the stacked batch back only
to hash it; then the payload's other bytes (its header, the padding) are copied in and the chunks
they complete hashed. One implementation for both ways a worker answers: a socket's reply is
stacked in this process (`PooledPayload`), a same-host client's straight into its memory file
(`loadax.wire.shared_memory.ClientFile`)."""

from __future__ import annotations

import abc
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadax.collate.batcher import LeafKinds, empty_leaf
from loadax.wire.checksum import ChunkDigests, Hasher, payload_checksum
from loadax.wire.codec import Blank, CodecError, layout
from loadax.wire.limits import MAX_BATCH_BYTES
from loadax.wire.v1 import worker_pb2 as wire

PIECE_BYTES = 1 << 20
"""A payload is copied in pieces of at most this many bytes, each hashed just before."""


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    """The frames of a payload as bytes (`views`), where each starts in it, where each lies in
    the buffer already (None: elsewhere), and the payload's size."""

    views: list[memoryview]
    starts: list[int]
    places: list[int | None]
    size: int


class StackedPayload(abc.ABC):
    """A buffer to stack a batch into as the payload it encodes to (`leaves` and `stacked`, a
    `loadax.collate.batcher.StackInto`), of at most `max_bytes`; with `checksum` XXH3 in chunks
    (the kind its reply carries), the chunks that stacking completes are hashed as they are."""

    def __init__(self, max_bytes: int, checksum: int) -> None:
        self._max_bytes = max_bytes
        self._checksum = checksum
        self._data: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._start = 0  # the address of `_data`
        # Of a batch stacked here: each leaf's start and bytes per row; the chunks hashed.
        self._rows: list[tuple[int, int]] = []
        self._chunks: ChunkDigests | None = None

    @abc.abstractmethod
    def _allocate(self, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The buffer, of at least `size` bytes (an OSError if it cannot be had)."""

    def leaves(self, structure: Any, kinds: LeafKinds) -> list[np.ndarray[Any, Any]] | None:
        """Arrays in the buffer at the places the encoding of a batch of `structure` with leaves
        of `kinds` gives them (`loadax.wire.codec.layout`), the buffer grown to the payload's
        size if it is shorter; None (stack it elsewhere) if the codec cannot encode such a batch
        (it says why when it is encoded), it is over `max_bytes`, or there is no buffer."""
        try:
            starts, size = layout(structure.unflatten([Blank(*kind) for kind in kinds]))
        except CodecError:
            return None
        if size > self._max_bytes:
            return None
        try:
            data = self._mapped(size)
        except OSError:
            return None
        self._rows = [
            (start, Blank(shape[1:], dtype).nbytes)
            for start, (shape, dtype) in zip(starts, kinds, strict=True)
        ]
        if self._checksum == wire.CHECKSUM_XXH3_CHUNKS:
            self._chunks = ChunkDigests(data, size)
        return [
            data[start : start + Blank(*kind).nbytes].view(kind[1]).reshape(kind[0])
            for start, kind in zip(starts, kinds, strict=True)
        ]

    def stacked(self, leaf: int, start: int, stop: int) -> None:
        """Rows `start` to `stop` of leaf `leaf` of `leaves` are final (each row is declared
        once): hash the chunks of the payload that completes."""
        if self._chunks is not None:
            at, row = self._rows[leaf]
            self._chunks.written(at + start * row, at + stop * row)

    def checksum(self, frames: Sequence[bytes | memoryview]) -> int:
        """The checksum of the payload `frames` make (of the kind given): if they are the batch
        stacked here with XXH3 in chunks, the chunks that stacking completed were hashed then,
        and the others are as the payload's other bytes are copied in now; else over `frames`,
        read once more. Once."""
        placed = self._placed(frames)
        chunks = self._stacked_chunks(placed)
        if chunks is None:
            return payload_checksum(frames, self._checksum)
        self._copy(placed, self._mapped(placed.size), None, chunks)
        return chunks.value()

    def holds(self, frames: Sequence[bytes | memoryview]) -> bool:
        """Whether any of `frames` lies in the buffer (was stacked there by `leaves`)."""
        return any(self._where(memoryview(frame).cast("B")) is not None for frame in frames)

    def _placed(self, frames: Sequence[bytes | memoryview]) -> Placed:
        """`frames` placed in the payload. A frame in the buffer at another place than its own
        (a view of a batch stacked here, encoded again) is copied out first: the copies before
        it could overwrite it."""
        views = [memoryview(frame).cast("B") for frame in frames]
        ends = list(itertools.accumulate(len(view) for view in views))
        starts = [0, *ends[:-1]]
        places = [self._where(view) for view in views]
        views = [
            view if place in (None, start) else memoryview(bytes(view))
            for view, place, start in zip(views, places, starts, strict=True)
        ]
        return Placed(views, starts, places, ends[-1] if ends else 0)

    def _stacked_chunks(self, placed: Placed) -> ChunkDigests | None:
        """The chunks hashed as the batch was stacked here, if the payload is that batch: of its
        size, with every leaf in place (and nothing else), so that the bytes declared written
        were the leaves' and the rest is what is copied in now."""
        chunks, self._chunks = self._chunks, None
        in_place = {
            start
            for place, start in zip(placed.places, placed.starts, strict=True)
            if place == start
        }
        if chunks is None or chunks.size != placed.size or in_place != {at for at, _ in self._rows}:
            return None
        return chunks

    def _copy(
        self,
        placed: Placed,
        data: np.ndarray[Any, np.dtype[np.uint8]],
        hasher: Hasher | None,
        chunks: ChunkDigests | None,
    ) -> None:
        """Copy the frames of `placed` not in place into `data`, each piece of at most
        `PIECE_BYTES` given to `hasher` just before and declared to `chunks` just after (each
        if given)."""
        for view, place, start in zip(placed.views, placed.places, placed.starts, strict=True):
            for offset in range(0, len(view), PIECE_BYTES):
                piece = view[offset : offset + PIECE_BYTES]
                if hasher is not None:
                    hasher.update(piece)
                if place != start:
                    at = start + offset
                    data[at : at + len(piece)] = np.frombuffer(piece, np.uint8)
                    if chunks is not None:
                        chunks.written(at, at + len(piece))

    def _mapped(self, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The buffer, of at least `size` bytes."""
        if self._data is None or len(self._data) < size:
            self._data = self._allocate(size)
            self._start = self._data.ctypes.data
        return self._data

    def _where(self, view: memoryview) -> int | None:
        """Where in the buffer `view` lies, if it lies in it."""
        if not view or self._data is None:
            return None
        where: int = np.frombuffer(view, np.uint8).ctypes.data - self._start
        return where if 0 <= where < len(self._data) else None


class PooledPayload(StackedPayload):
    """A payload stacked in this process, to be sent: only with XXH3 in chunks (a batch whose
    reply carries another kind is stacked as any other, its leaves apart, and checksummed over
    its frames), in a buffer reused once nothing refers to the batch, as large stacked leaves
    are (`loadax.collate.batcher.empty_leaf`)."""

    def __init__(self, checksum: int, max_bytes: int | None = None) -> None:
        super().__init__(max_bytes or MAX_BATCH_BYTES, checksum)

    def leaves(self, structure: Any, kinds: LeafKinds) -> list[np.ndarray[Any, Any]] | None:
        if self._checksum != wire.CHECKSUM_XXH3_CHUNKS:
            return None
        return super().leaves(structure, kinds)

    def _allocate(self, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return empty_leaf((size,), np.dtype(np.uint8))
