"""A worker's answer to a batch request, its header, and the raw-bytes gRPC methods that carry it.

Wrapping a large payload in a `BatchResponse` message copies it, and parsing the message copies
it again. So a worker answers an `EncodedBatch` (the codec's frames, views of the batch's arrays)
and each transport sends the frames as raw bytes: ZeroMQ as frames of their own after the header,
gRPC by one of two methods outside the protobuf schema whose request is a `BatchRequest` (the
schema's `Worker.LoadBatch` stays, for standard gRPC tools):

- `LOAD_BATCH_PAYLOAD`, unary: the header and the payload joined in one reply (`payload_reply`,
  read back by `parse_payload_reply`, its payload a view of the reply);
- `STREAM_BATCH`, server streaming: the header, then the payload in messages of at most
  `CHUNK_BYTES` (`stream_messages`, read back by `read_stream`), which neither end joins: only an
  array larger than a message is put together again, in a buffer the client reuses.
  A client that sends the metadata `HEARTBEAT_METADATA` ("loadax-heartbeat-ms": N) gets
  heartbeats before the header: an empty message (`HEARTBEAT`) at once, then one every N ms
  while the batch is made, which it drops. A worker without heartbeats ignores the metadata:
  its client, seeing a header first, no longer times its silence. A client that does not ask
  gets none.

A client streams a batch of `STREAM_FROM_BYTES` or more, and asks for a smaller one in one reply
(one of `DATA_SOCKET_FROM_BYTES` or more on the worker's data socket, when one is open).
The header (a `BatchResponse` without its payload) names what the batch was made for and carries
the payload's checksum, which the client checks before decoding.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence

from google.protobuf.message import DecodeError

from loadax.wire.checksum import Hasher, available, new_hasher, payload_checksum
from loadax.wire.codec import ARRAY_ALIGN
from loadax.wire.limits import MAX_BATCH_BYTES
from loadax.wire.plans import request_digest
from loadax.wire.v1 import worker_pb2 as wire

PAYLOAD_SERVICE = "loadax.wire.v1.Payloads"
LOAD_BATCH_PAYLOAD = f"/{PAYLOAD_SERVICE}/LoadBatch"
STREAM_BATCH = f"/{PAYLOAD_SERVICE}/StreamBatch"
HEARTBEAT_METADATA = "loadax-heartbeat-ms"
HEARTBEAT = b""
HEARTBEAT_MS_RANGE = (10, 60_000)
"""The heartbeat intervals a worker sends (milliseconds); it refuses others INVALID_ARGUMENT."""
STREAM_FROM_BYTES = 8 << 20
"""The batch size from which a client streams. A reply of a whole batch is held twice while it is
received: by gRPC core as it arrives, and by grpcio's fresh `bytes` of the whole message. Both come
from glibc's per-thread arenas, which keep freed blocks below 32 MiB, so at 8 MiB (prefetch 4) the
client's peak was its base + 135-138 MiB, over the base + 64 MiB that base + (in flight + 2) x batch
bytes allows; streamed (`STREAM_WINDOW_BYTES`, `CHUNK_BYTES`), it is base + 42-47 MiB. The
stream costs a little more CPU at this size (a Python call per message, and joining the messages
of an array): client 0.89 vs 0.80 s/GB, 1.01 vs 1.09 GB/s, medians of 3 alternated on loopback, 2
cores. Above 24 MiB it is the cheaper path (1.0 vs 1.5 s/GB at 64 MiB)."""
DATA_SOCKET_FROM_BYTES = 1 << 20
"""The batch size from which a client asks for its reply on the worker's data socket (the first
batch of a pipeline too), when one is open; a smaller one comes on its call as without one. A
reply there costs a streamed call with heartbeats (on the worker a thread per batch) and a turn of
the client's I/O thread, 0.3-0.5 ms of the client's CPU and 0.3-0.9 ms of the worker's more than one
unary reply, which its saved copies repay from about 1 MiB. One worker, no record cost, loopback,
2 shared cores, data socket / one reply, client (worker) CPU per batch in us, 2 rounds: 32 KiB
1018-1241 / 678-686 (1427-1715 / 788-801); 256 KiB 946-1003 / 747-938 (1339-1389 / 839-1089);
1 MiB 1166-1697 / 1819-2356 (1629-2331 / 1479-1930), batches/s 384-564 / 334-445; 2 MiB
1587-1862 / 3094-3430 (2155-2581 / 2155-2607); 4 MiB 2233-2640 / 4714-4950."""
STREAM_WINDOW_BYTES = 1 << 20
"""How far ahead of its reader gRPC receives a call (its HTTP/2 window, fixed: gRPC's BDP probing
grows it, and streamed 8 MiB batches then peaked at base + 64-82 MiB). Measured on loopback with
`CHUNK_BYTES` messages, alternated 3 times against 2 MiB: client 0.81-0.89 vs 0.87-0.97 s/GB and
0.97-1.04 vs 0.93-1.01 GB/s at 8 MiB, and at 8 MiB and prefetch 2 a peak of base + 44-47 MiB (5
rounds) vs 48-56 (the bound allows 48); 4 MiB took it to base + 72. A window for each call in
flight (6 at prefetch 4) is 6 MiB per worker: about 1.2 GB/s at a round trip of 5 ms, 12 at 0.5."""
CHUNK_BYTES = 512 << 10
"""The largest message of a stream after its header. Measured on loopback, 2 cores, alternated, with
`STREAM_WINDOW_BYTES`: the client's CPU at 8 MiB batches 0.81-0.88 s/GB with 512 KiB, 1.0-1.14 with
1 MiB (grpcio's fresh `bytes` of a 1 MiB message page-fault far more: 70-140 k vs 4-23 k faults/GB),
0.97-1.07 with 256 KiB (more messages, each with a cost); at 64 MiB 0.71-0.87 vs 0.84-0.99. The
worker pays for the messages: 0.56-0.65 vs 0.49-0.58 s/GB at 64 MiB. The client's peak memory at
8 MiB, prefetch 2: base + 40-44 MiB vs 46-50. With the client's heap kept (`GrpcTransport`), R1
over the sockets (38.5 MB batches) with 512 KiB, 1 MiB and 2.4 MiB messages, 6 rounds
alternated (load 1.9-3.6): worker 1.47, 1.50 and 1.48 s/GB (medians; 1.27-1.62 in all), client
0.85, 0.85 and 0.87: fewer messages halved the worker's thread switches in its profile (9 % of
its samples -> 4 %) and the cost moved to copies of messages no longer in the cache."""
_HEADER_LENGTH = struct.Struct("<I")
_MAX_HEADER_BYTES = 64 << 10  # about 100 bytes; a stream's adds about 8 per MiB of payload


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedBatch:
    """The batch (or stream window) a request asked for, as `loadax.wire.codec.encode_frames` gives
    it (the arrays' frames are views of the batch's arrays, not copies), with what its header says:
    the pipeline identity that made it, the digest of the request it answers and its checksum
    (of the kind `checksum_kind`; None until computed: a payload bound for the client's memory
    file is checksummed as it is written there, each piece read from memory once for both).
    `shared_size` is set instead of `frames` when the payload was written into the client's
    memory file (`loadax.wire.shared_memory`): its size. `borrowed`: its arrays were stacked in
    that file (`ClientFile`), which its client reuses once answered, so that any other reply is
    made of a copy (`owned`). `reuse` says whether it was computed for this request or for
    another with its digest.

    `release` frees what the worker holds for it (its share of the memory budget): the transport
    calls it once the reply has left, or was dropped; calls after the first do nothing."""

    step: int
    frames: Sequence[bytes | memoryview]
    fingerprint: str = ""
    request_digest: bytes = b""
    checksum: int | None = 0
    checksum_kind: wire.Checksum = wire.CHECKSUM_WEIGHTED_SUM
    shared_size: int | None = None
    borrowed: bool = False
    reuse: wire.Reuse = wire.REUSE_COMPUTED
    load: float = 0.0  # the worker's when it answers, per loading slot (`loadax.wire.load`)
    loading_slots: int = 0
    release: Callable[[], None] = dataclasses.field(default=lambda: None, compare=False)

    @classmethod
    def answering(
        cls,
        request: wire.BatchRequest,
        fingerprint: str,
        frames: Sequence[bytes | memoryview],
        *,
        checksummed: bool = True,
    ) -> EncodedBatch:
        """The answer to `request` that `frames` encode, made by the pipeline `fingerprint`,
        with the checksum the request asks for if this process has it (not yet computed unless
        `checksummed`)."""
        kind = answer_checksum(request)
        checksum = payload_checksum(frames, kind) if checksummed else None
        return cls(request.step, frames, fingerprint, request_digest(request), checksum, kind)

    def checksummed_for(self, request: wire.BatchRequest) -> EncodedBatch:
        """This batch with the checksum that answers `request` (`answer_checksum`): computed
        again if it has another, as a batch built for one client's request may be served to
        another's (a worker's shared replies) that asks for another kind, or computed now if it
        was not yet."""
        kind = answer_checksum(request)
        if kind == self.checksum_kind and self.checksum is not None:
            return self
        checksum = payload_checksum(self.frames, kind)
        return dataclasses.replace(self, checksum=checksum, checksum_kind=kind)

    def owned(self) -> EncodedBatch:
        """This batch in this process's memory: a copy, if it is `borrowed`."""
        if not self.borrowed:
            return self
        return dataclasses.replace(self, frames=(b"".join(self.frames),), borrowed=False)

    @property
    def size(self) -> int:
        """The bytes of the encoding."""
        if self.shared_size is not None:
            return self.shared_size
        return sum(len(frame) for frame in self.frames)

    @property
    def payload(self) -> bytes:
        """The encoding as one buffer (a copy), for the schema's `Worker.LoadBatch`."""
        return b"".join(self.frames)

    @property
    def header(self) -> wire.BatchResponse:
        """The reply's header: a `BatchResponse` without its payload."""
        if self.checksum is None:
            raise ValueError(f"the checksum of the batch of step {self.step} was never computed")
        return wire.BatchResponse(
            step=self.step,
            fingerprint=self.fingerprint,
            request_digest=self.request_digest,
            checksum=self.checksum,
            payload_size=self.size,
            checksum_kind=self.checksum_kind,
            shared_memory=self.shared_size is not None,
            reuse=self.reuse,
            load=self.load,
            loading_slots=self.loading_slots,
        )


def answer_checksum(request: wire.BatchRequest) -> wire.Checksum:
    """The checksum kind that answers `request`: the one it asks for if this process has it,
    else the weighted sums, which every loadax has."""
    return request.checksum if available(request.checksum) else wire.CHECKSUM_WEIGHTED_SUM


def payload_reply(header: wire.BatchResponse, frames: Sequence[bytes | memoryview]) -> bytes:
    """The reply of `LOAD_BATCH_PAYLOAD`: the header's length (uint32, little-endian), the header,
    zeros up to the next multiple of 64 (so that the arrays keep the codec's alignment), then the
    payload (`frames` joined).

    >>> from loadax.wire.payloads import EncodedBatch, parse_payload_reply, payload_reply
    >>> batch = EncodedBatch(3, [b"LDX1..."])
    >>> header, payload = parse_payload_reply(payload_reply(batch.header, batch.frames))
    >>> header.step, header.payload_size, bytes(payload)
    (3, 7, b'LDX1...')
    """
    encoded = header.SerializeToString()
    end = _HEADER_LENGTH.size + len(encoded)
    prefix = _HEADER_LENGTH.pack(len(encoded)) + encoded + bytes(-end % ARRAY_ALIGN)
    return b"".join([prefix, *frames])


def parse_payload_reply(reply: bytes | memoryview) -> tuple[wire.BatchResponse, memoryview]:
    """The header of a `LOAD_BATCH_PAYLOAD` reply, and its payload as a view of `reply` (no copy);
    a `MalformedReply` if it has no header."""
    view = memoryview(reply).cast("B")
    if len(view) < _HEADER_LENGTH.size:
        raise MalformedReply(f"a reply of {len(view)} bytes is too short for a header")
    (length,) = _HEADER_LENGTH.unpack_from(view)
    end = _HEADER_LENGTH.size + length
    if end > len(view):
        raise MalformedReply(f"the reply declares a header of {length} bytes in {len(view)} bytes")
    header = _header(view[_HEADER_LENGTH.size : end])
    start = end + -end % ARRAY_ALIGN
    return header, view[min(start, len(view)) :]


class MalformedReply(ValueError):
    """A reply of `LOAD_BATCH_PAYLOAD` or `STREAM_BATCH` that breaks its format: the worker's
    fault, which a client refuses as a bad reply."""


def stream_messages(batch: EncodedBatch, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The messages of a `STREAM_BATCH` reply: the header, whose `segment_sizes` say how the
    payload is cut, then each segment in one message, or in messages of `chunk` bytes if it is
    larger. A segment is a frame larger than `chunk`, or a run of smaller frames joined; arrays
    never span frames, so they never span segments.

    Each message is a `bytes` made here, as grpcio sends nothing else (and copies it again into
    a buffer of its own); none is larger than `chunk`, so no whole batch is copied at once.

    >>> from loadax.wire.payloads import EncodedBatch, read_stream, stream_messages
    >>> batch = EncodedBatch(3, [b"LDX1", b"...", bytes(10)])
    >>> [len(message) for message in stream_messages(batch, chunk=8)][1:]
    [7, 8, 2]
    >>> take = lambda size: memoryview(bytearray(size))  # a writable buffer of `size` bytes
    >>> header, segments = read_stream(stream_messages(batch, chunk=8), take)
    >>> header.step, list(header.segment_sizes), [bytes(s) for s in segments][0]
    (3, [7, 10], b'LDX1...')
    """
    segments = _segments(batch.frames, chunk)
    header = batch.header
    header.segment_sizes.extend(sum(len(frame) for frame in parts) for parts in segments)
    yield header.SerializeToString()
    for parts in segments:
        if len(parts) > 1 or len(parts[0]) <= chunk:
            yield b"".join(parts)  # no copy of a single `bytes`
        else:
            view = memoryview(parts[0]).cast("B")
            for start in range(0, len(view), chunk):
                yield bytes(view[start : start + chunk])


def _segments(frames: Sequence[bytes | memoryview], chunk: int) -> list[list[bytes | memoryview]]:
    segments: list[list[bytes | memoryview]] = []
    run: list[bytes | memoryview] = []
    run_size = 0
    for frame in frames:
        size = len(memoryview(frame).cast("B"))
        if run and run_size + size > chunk:
            segments.append(run)
            run, run_size = [], 0
        if size > chunk:
            segments.append([frame])
        elif size:
            run.append(frame)
            run_size += size
    if run:
        segments.append(run)
    return segments


Buffer = bytes | memoryview


def read_stream(
    messages: Iterable[bytes], take: Callable[[int], memoryview]
) -> tuple[wire.BatchResponse, list[Buffer]]:
    """The header of a `STREAM_BATCH` reply and its payload's segments, as `messages` brings
    them: a segment that came in one message is that message; one that came in several is
    joined into `take(size)`, a writable buffer of `size` bytes.

    Sizes are checked before anything is allocated for them, and every message against them:
    a reply that breaks the format is a `MalformedReply` naming what is wrong (its checksum is the
    caller's to check).
    """
    stream = iter(messages)
    first = next(stream, None)
    if first is None:
        raise MalformedReply("the stream ended before its header")
    header = _header(first)
    sizes = list(header.segment_sizes)
    if header.payload_size > MAX_BATCH_BYTES:
        raise MalformedReply(
            f"its header declares {header.payload_size} payload bytes, more than the "
            f"{MAX_BATCH_BYTES} a reply may hold"
        )
    # A payload in the client's memory file (`header.shared_memory`) comes in no message.
    if sum(sizes) != (0 if header.shared_memory else header.payload_size) or not all(sizes):
        raise MalformedReply(
            f"its header's segments {sizes[:8]}{'...' if len(sizes) > 8 else ''} do not cut "
            f"its {header.payload_size} payload bytes"
            + (" (in shared memory: none come)" if header.shared_memory else "")
        )
    segments = [_segment(stream, index, size, take) for index, size in enumerate(sizes)]
    extra = next(stream, None)
    if extra is not None:
        raise MalformedReply(
            f"a message of {len(extra)} bytes follows the {len(sizes)} segments its header declares"
        )
    return header, segments


class ChecksummedStream:
    """The messages of a `STREAM_BATCH` reply, passed on as they come, its payload checksummed
    on the way (of the kind its header names) while each message is in the CPU's cache.

    >>> from loadax.wire.checksum import payload_checksum
    >>> from loadax.wire.payloads import ChecksummedStream, EncodedBatch, stream_messages
    >>> batch = EncodedBatch(3, [b"LDX1", b"..."])
    >>> stream = ChecksummedStream(stream_messages(batch, chunk=2))
    >>> _ = list(stream)
    >>> stream.value() == payload_checksum(batch.frames)
    True
    """

    def __init__(self, messages: Iterable[bytes]) -> None:
        self._messages = messages
        self._hasher: Hasher | None = None

    def __iter__(self) -> Iterator[bytes]:
        stream = iter(self._messages)
        first = next(stream, None)
        if first is None:
            return
        kind = _header(first).checksum_kind
        hasher = self._hasher = new_hasher(kind) if available(kind) else None
        yield first
        for message in stream:
            if hasher is not None:
                hasher.update(memoryview(message))
            yield message

    def value(self) -> int | None:
        """The checksum of the payload's messages (None: a kind this process cannot compute,
        or no header came); once every message has passed."""
        return None if self._hasher is None else self._hasher.value()


def _segment(
    stream: Iterator[bytes], index: int, size: int, take: Callable[[int], memoryview]
) -> Buffer:
    """Segment `index` of `size` bytes: the next message, or the next messages joined."""
    message = _message(stream, index, size, size)
    if len(message) == size:
        return message
    buffer = take(size).cast("B")
    filled = 0
    while True:
        buffer[filled : filled + len(message)] = message
        filled += len(message)
        if filled == size:
            return buffer
        message = _message(stream, index, size, size - filled)


def _message(stream: Iterator[bytes], index: int, size: int, left: int) -> bytes:
    """The next message, which holds the next bytes of segment `index` (`left` of `size`)."""
    message = next(stream, None)
    if message is None:
        raise MalformedReply(
            f"the stream ended {left} bytes short of segment {index} ({size} bytes)"
        )
    if not message or len(message) > left:
        raise MalformedReply(
            f"a message of {len(message)} bytes does not fit segment {index} ({left} of its "
            f"{size} bytes left)"
        )
    return message


def _header(encoded: bytes | memoryview) -> wire.BatchResponse:
    """The `BatchResponse` a reply's header encodes."""
    if len(encoded) > _MAX_HEADER_BYTES:
        raise MalformedReply(f"its header of {len(encoded)} bytes is over {_MAX_HEADER_BYTES}")
    header = wire.BatchResponse()
    try:
        header.ParseFromString(bytes(encoded))
    except DecodeError as error:
        raise MalformedReply(f"its header is not a BatchResponse: {error}") from None
    return header
