"""The ZeroMQ framing of worker requests and replies, shared by the worker and the client.

A request is `[request_id, method, body]`; a reply is `[request_id, b"ok", body]`,
`[request_id, b"ok", head, payload]` for a batch, or `[request_id, b"error", ErrorReply]`.
The request id is 8 bytes, a big-endian uint64 the client chooses; the worker echoes it.
A batch reply carries its payload in a frame of its own, not inside the protobuf, so that the
client can decode the batch as a view of the received frame (parsing a protobuf copies `bytes`):
its `head` is a `BatchResponse` whose `payload` is left empty.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Generic, TypeAlias, TypeVar

from google.protobuf.message import DecodeError, Message

from loadax.errors import WorkerError
from loadax.wire.v1 import worker_pb2 as wire

HANDSHAKE, LOAD_BATCH, INFO = b"Handshake", b"LoadBatch", b"Info"
OK, ERROR = b"ok", b"error"
MAX_REQUEST_ID = 2**64 - 1

RequestMessage: TypeAlias = wire.HandshakeRequest | wire.BatchRequest | wire.InfoRequest
ResponseMessage: TypeAlias = wire.HandshakeResponse | wire.BatchResponse | wire.InfoResponse
Buffer: TypeAlias = bytes | memoryview
R = TypeVar("R", wire.HandshakeResponse, wire.InfoResponse)
M = TypeVar("M", bound=Message)

REQUEST_TYPES: dict[bytes, type[RequestMessage]] = {
    HANDSHAKE: wire.HandshakeRequest,
    LOAD_BATCH: wire.BatchRequest,
    INFO: wire.InfoRequest,
}
_METHODS: dict[type[RequestMessage], bytes] = {kind: name for name, kind in REQUEST_TYPES.items()}
_REQUEST_ID = struct.Struct(">Q")


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A parsed request; its method is implied by the message's type."""

    request_id: int
    message: RequestMessage


@dataclasses.dataclass(frozen=True, slots=True)
class Reply(Generic[R]):
    """A parsed successful reply to a handshake or an info request."""

    request_id: int
    response: R


@dataclasses.dataclass(frozen=True, slots=True)
class BatchReply:
    """A parsed successful batch reply; `payload` is a view of the received payload frame."""

    request_id: int
    step: int
    payload: memoryview


def method_of(message: RequestMessage) -> bytes:
    return _METHODS[type(message)]


def encode_request_id(request_id: int) -> bytes:
    if not 0 <= request_id <= MAX_REQUEST_ID:
        raise ValueError(f"request id must be a uint64, got {request_id}")
    return _REQUEST_ID.pack(request_id)


def parse_request_id(frame: Buffer) -> int:
    if len(frame) != _REQUEST_ID.size:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"the request id frame must be {_REQUEST_ID.size} bytes, got {len(frame)}",
        )
    request_id: int = _REQUEST_ID.unpack(frame)[0]
    return request_id


def request_frames(request_id: int, message: RequestMessage) -> list[bytes]:
    return [encode_request_id(request_id), method_of(message), message.SerializeToString()]


def parse_request(frames: Sequence[Buffer]) -> Request:
    """The request in `frames` (without the ROUTER's identity frame)."""
    if len(frames) != 3:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"a request has 3 frames (request id, method, body), got {len(frames)}",
        )
    request_id = parse_request_id(frames[0])
    method = bytes(frames[1])
    kind = REQUEST_TYPES.get(method)
    if kind is None:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"unknown method {method[:40]!r}: expected one of {sorted(REQUEST_TYPES)}",
        )
    return Request(request_id, _parse(kind, frames[2], f"a {method.decode()} request"))


def reply_frames(request_id: int, response: ResponseMessage) -> list[bytes]:
    """The frames of a successful reply; a batch's payload travels as a fourth frame."""
    frame_id = encode_request_id(request_id)
    if isinstance(response, wire.BatchResponse):
        head = wire.BatchResponse(step=response.step).SerializeToString()
        return [frame_id, OK, head, response.payload]
    return [frame_id, OK, response.SerializeToString()]


def error_frames(request_id: int, error: WorkerError) -> list[bytes]:
    body = wire.ErrorReply(code=error.code, message=error.message).SerializeToString()
    return [encode_request_id(request_id), ERROR, body]


def parse_reply(frames: Sequence[Buffer], expected: type[R]) -> Reply[R]:
    """The reply in `frames` to a handshake or info request that expects `expected`.

    An error reply is raised as the worker's `WorkerError`; a malformed reply raises one with
    code INVALID_ARGUMENT.
    """
    what = expected.__name__
    request_id = _parse_status(frames, 3, what)
    return Reply(request_id, _parse(expected, frames[2], what))


def parse_batch_reply(frames: Sequence[Buffer]) -> BatchReply:
    """The reply in `frames` to a batch request; errors as in `parse_reply`.

    The payload is not copied: `loadax.codec.decode(reply.payload)` gives arrays that view it.
    """
    request_id = _parse_status(frames, 4, "BatchResponse")
    head = _parse(wire.BatchResponse, frames[2], "BatchResponse")
    return BatchReply(request_id, head.step, memoryview(frames[3]).toreadonly())


def _parse_status(frames: Sequence[Buffer], count: int, what: str) -> int:
    """The request id of a successful reply of `count` frames; an error reply is raised."""
    if len(frames) < 3:
        raise WorkerError("INVALID_ARGUMENT", f"a reply has at least 3 frames, got {len(frames)}")
    request_id = parse_request_id(frames[0])
    status = bytes(frames[1])
    if status == ERROR:
        _require_count(frames, 3, "an error reply")
        error = _parse(wire.ErrorReply, frames[2], "ErrorReply")
        raise WorkerError(error.code or "UNKNOWN", error.message)
    if status != OK:
        raise WorkerError("INVALID_ARGUMENT", f"unknown reply status {status[:40]!r}")
    _require_count(frames, count, f"a {what} reply")
    return request_id


def _require_count(frames: Sequence[Buffer], count: int, what: str) -> None:
    if len(frames) != count:
        raise WorkerError("INVALID_ARGUMENT", f"{what} has {count} frames, got {len(frames)}")


def _parse(kind: type[M], body: Buffer, what: str) -> M:
    message = kind()
    try:
        message.ParseFromString(bytes(body))  # small: payloads never pass through here
    except DecodeError as error:
        raise WorkerError(
            "INVALID_ARGUMENT", f"the body of {what} is not a valid {kind.__name__}: {error}"
        ) from error
    return message
