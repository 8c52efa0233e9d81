"""The worker's requests and replies as messages, whatever transport carries them.

A request's method is implied by its message's type, so that the servers, the metrics and the
ZeroMQ framing name it the same way as the gRPC service does.
"""

from __future__ import annotations

from typing import TypeAlias

from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

HANDSHAKE, LOAD_BATCH, INFO = "Handshake", "LoadBatch", "Info"

RequestMessage: TypeAlias = wire.HandshakeRequest | wire.BatchRequest | wire.InfoRequest
ResponseMessage: TypeAlias = wire.HandshakeResponse | EncodedBatch | wire.InfoResponse

REQUEST_TYPES: dict[str, type[RequestMessage]] = {
    HANDSHAKE: wire.HandshakeRequest,
    LOAD_BATCH: wire.BatchRequest,
    INFO: wire.InfoRequest,
}
"""Each method's request message, by the method's name in the `Worker` service."""
_METHODS: dict[type[RequestMessage], str] = {kind: name for name, kind in REQUEST_TYPES.items()}


def method_of(message: RequestMessage) -> str:
    """The name of the method that `message` is the request of, e.g. "LoadBatch"."""
    return _METHODS[type(message)]
