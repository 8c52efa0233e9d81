"""A worker's answer to a batch request, and the raw-bytes gRPC method that carries it.

Wrapping a large payload in a `BatchResponse` message copies it, and parsing the message copies
it again. So a worker answers an `EncodedBatch`, and each transport sends the payload as raw
bytes: ZeroMQ as a frame of its own, gRPC as the whole reply of `LOAD_BATCH_PAYLOAD`, a method
outside the protobuf schema whose request is a `BatchRequest` and whose reply is the payload
itself (the schema's `Worker.LoadBatch` stays, for standard gRPC tools).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

PAYLOAD_SERVICE = "loadax.wire.v1.Payloads"
LOAD_BATCH_PAYLOAD = f"/{PAYLOAD_SERVICE}/LoadBatch"


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedBatch:
    """The batch (or stream window) a request asked for, as `loadax.wire.codec.encode_frames` gives
    it: the arrays' frames are views of the batch's arrays, not copies."""

    step: int
    frames: Sequence[bytes | memoryview]

    @property
    def size(self) -> int:
        """The bytes of the encoding."""
        return sum(len(frame) for frame in self.frames)

    @property
    def payload(self) -> bytes:
        """The encoding as one buffer (a copy), for a transport that sends one."""
        return b"".join(self.frames)
