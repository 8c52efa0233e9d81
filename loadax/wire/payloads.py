"""A worker's answer to a batch request, its header, and the raw-bytes gRPC method that carries it.

Wrapping a large payload in a `BatchResponse` message copies it, and parsing the message copies
it again. So a worker answers an `EncodedBatch`, and each transport sends the payload as raw
bytes: ZeroMQ as frames of their own after the header, gRPC as the reply of `LOAD_BATCH_PAYLOAD`,
a method outside the protobuf schema whose request is a `BatchRequest` and whose reply is the
header and the payload in one buffer (`payload_reply`); the schema's `Worker.LoadBatch` stays, for
standard gRPC tools. The header (a `BatchResponse` without its payload) names what the batch was
made for and carries the payload's checksum, which the client checks before decoding.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence

from google.protobuf.message import DecodeError

from loadax.errors import WorkerError
from loadax.wire.checksum import payload_checksum
from loadax.wire.failures import BAD_REPLY
from loadax.wire.plans import request_digest
from loadax.wire.v1 import worker_pb2 as wire

PAYLOAD_SERVICE = "loadax.wire.v1.Payloads"
LOAD_BATCH_PAYLOAD = f"/{PAYLOAD_SERVICE}/LoadBatch"
_HEADER_LENGTH = struct.Struct("<I")
_ALIGN = 64  # the payload starts at a multiple of this, as the codec aligns arrays
_MAX_HEADER_BYTES = 4096  # a header is about 100 bytes


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedBatch:
    """The batch (or stream window) a request asked for, as `loadax.wire.codec.encode_frames` gives
    it (the arrays' frames are views of the batch's arrays, not copies), with what its header says:
    the pipeline identity that made it, the digest of the request it answers and its checksum.

    `release` frees what the worker holds for it (its share of the memory budget): the transport
    calls it once the reply has left, or was dropped; calls after the first do nothing."""

    step: int
    frames: Sequence[bytes | memoryview]
    fingerprint: str = ""
    request_digest: bytes = b""
    checksum: int = 0
    release: Callable[[], None] = dataclasses.field(default=lambda: None, compare=False)

    @classmethod
    def answering(
        cls, request: wire.BatchRequest, fingerprint: str, frames: Sequence[bytes | memoryview]
    ) -> EncodedBatch:
        """The answer to `request` that `frames` encode, made by the pipeline `fingerprint`."""
        return cls(
            request.step, frames, fingerprint, request_digest(request), payload_checksum(frames)
        )

    @property
    def size(self) -> int:
        """The bytes of the encoding."""
        return sum(len(frame) for frame in self.frames)

    @property
    def payload(self) -> bytes:
        """The encoding as one buffer (a copy), for a transport that sends one."""
        return b"".join(self.frames)

    @property
    def header(self) -> wire.BatchResponse:
        """The reply's header: a `BatchResponse` without its payload."""
        return wire.BatchResponse(
            step=self.step,
            fingerprint=self.fingerprint,
            request_digest=self.request_digest,
            checksum=self.checksum,
            payload_size=self.size,
        )


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
    prefix = _HEADER_LENGTH.pack(len(encoded)) + encoded + bytes(-end % _ALIGN)
    return b"".join([prefix, *frames])


def parse_payload_reply(reply: bytes | memoryview) -> tuple[wire.BatchResponse, memoryview]:
    """The header of a `LOAD_BATCH_PAYLOAD` reply, and its payload as a view of `reply` (no copy).
    A malformed reply is a BAD_REPLY `WorkerError`: the worker's fault, not the request's."""
    view = memoryview(reply).cast("B")
    if len(view) < _HEADER_LENGTH.size:
        raise WorkerError(BAD_REPLY, f"a reply of {len(view)} bytes is too short for a header")
    (length,) = _HEADER_LENGTH.unpack_from(view)
    end = _HEADER_LENGTH.size + length
    if length > _MAX_HEADER_BYTES or end > len(view):
        raise WorkerError(
            BAD_REPLY, f"the reply declares a header of {length} bytes in {len(view)} bytes"
        )
    header = wire.BatchResponse()
    try:
        header.ParseFromString(bytes(view[_HEADER_LENGTH.size : end]))
    except DecodeError as error:
        raise WorkerError(
            BAD_REPLY, f"the reply's header is not a BatchResponse: {error}"
        ) from None
    start = end + -end % _ALIGN
    return header, view[min(start, len(view)) :]
