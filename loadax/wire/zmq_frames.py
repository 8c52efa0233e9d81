"""The ZeroMQ framing of worker requests and replies, shared by the worker and the client.

A request is `[request_id, method, body]`, or `[request_id, method, body, b"Bearer " + token]`
to a worker that requires a token (a shared secret); a reply is `[request_id, b"ok", body]`,
`[request_id, b"ok", head, *payload]` for a batch, or `[request_id, b"error", ErrorReply]`.
The request id is 8 bytes, a big-endian uint64 the client chooses; the worker echoes it.
A cancel, `[request_id, b"Cancel", b""]` (with the token as 4th frame, as any request), says that
the client no longer waits for its request `request_id`. It has no reply: the worker gives that
request up if it still waits to load, drops its reply if it is loading, and ignores a cancel of
a request it has answered or never had. A malformed one (a body that is not empty) is refused
with INVALID_ARGUMENT, as any malformed request.
A batch reply carries its payload as frames of their own (`loadax.wire.codec.encode_frames`: the
codec's header, then each array's bytes, sent from the array without a copy, in frames of at
most `PAYLOAD_FRAME_BYTES`), not inside the protobuf (parsing a protobuf copies `bytes`): its
`head` is the batch's header, a `BatchResponse` whose `payload` is empty and whose `payload_size`
says how many bytes the payload frames hold together, so that a client can receive them into one
buffer of that size, and decode each array as a view of it.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Generic, TypeAlias, TypeVar

from google.protobuf.message import DecodeError, Message

from loadax.errors import WorkerError
from loadax.wire.credentials import BEARER, MAX_TOKEN_CHARS, bearer
from loadax.wire.failures import BAD_REPLY, error_from_reply, error_reply
from loadax.wire.messages import REQUEST_TYPES, RequestMessage, ResponseMessage, method_of
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

OK, ERROR = b"ok", b"error"
CANCEL = b"Cancel"
MAX_REQUEST_ID = 2**64 - 1
PAYLOAD_FRAME_BYTES = 1 << 20
"""The most bytes one payload frame of a batch reply holds; a larger array is sent as several
views of it. libzmq receives each frame into a message of its own before the client copies it
out: messages of this size the client's allocator reuses, where one of a whole batch of tens of
MiB is fresh memory each time, a page fault per 4 KiB. Receiving 64 MiB batches on loopback,
the client spent 0.40 s/GB (10 k faults/GB) with 1 MiB frames, 0.44 with 4 MiB, 0.53 with
16 MiB, 0.77 (243 k faults/GB) with one frame per array, and 0.55 with 256 KiB (per frame costs
on both ends)."""

Buffer: TypeAlias = bytes | memoryview
R = TypeVar("R", wire.HandshakeResponse, wire.InfoResponse)
M = TypeVar("M", bound=Message)

_METHOD_FRAMES = {name.encode("ascii"): kind for name, kind in REQUEST_TYPES.items()}
_REQUEST_ID = struct.Struct(">Q")


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A parsed request; its method is implied by the message's type."""

    request_id: int
    message: RequestMessage
    token: bytes | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Reply(Generic[R]):
    """A parsed successful reply to a handshake or an info request."""

    request_id: int
    response: R


@dataclasses.dataclass(frozen=True, slots=True)
class BatchReply:
    """A parsed successful batch reply: its header, and views of the received payload frames."""

    request_id: int
    header: wire.BatchResponse
    payload: list[memoryview]


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


def request_frames(
    request_id: int, message: RequestMessage, token: str | None = None
) -> list[bytes]:
    method = method_of(message).encode("ascii")
    frames = [encode_request_id(request_id), method, message.SerializeToString()]
    if token is not None:
        frames.append(bearer(token))
    return frames


def cancel_frames(request_id: int, token: str | None = None) -> list[bytes]:
    """The frames of a cancel of the request `request_id` (see the module docstring)."""
    frames = [encode_request_id(request_id), CANCEL, b""]
    if token is not None:
        frames.append(bearer(token))
    return frames


def parse_cancel(frames: Sequence[Buffer]) -> int | None:
    """The request id that the cancel in `frames` gives up (without the ROUTER's identity frame,
    and the token checked already); None if `frames` is not a cancel."""
    request_id = parse_request_id(frames[0])
    if bytes(frames[1][: len(CANCEL) + 1]) != CANCEL:
        return None
    if len(frames[2]):
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"the body of a Cancel is empty, got {len(frames[2])} bytes",
        )
    return request_id


def parse_request(frames: Sequence[Buffer]) -> Request:
    """The request in `frames` (without the ROUTER's identity frame); not a cancel
    (`parse_cancel`)."""
    token = request_token(frames)
    request_id = parse_request_id(frames[0])
    method = bytes(frames[1])
    kind = _METHOD_FRAMES.get(method)
    if kind is None:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"unknown method {method[:40]!r}: expected one of {sorted([*_METHOD_FRAMES, CANCEL])}",
        )
    return Request(request_id, _parse(kind, frames[2], f"a {method.decode()} request"), token)


def request_token(frames: Sequence[Buffer]) -> bytes | None:
    """The token that the request in `frames` carries (None: none), read before anything else
    of it, so that a worker can refuse a request without the right one unparsed."""
    if len(frames) not in (3, 4):
        raise WorkerError(
            "INVALID_ARGUMENT",
            "a request has 3 frames (request id, method, body) and a 4th if it carries a "
            f"token, got {len(frames)}",
        )
    if len(frames) == 3:
        return None
    token = bytes(frames[3][: len(BEARER) + MAX_TOKEN_CHARS + 1])
    if not token.startswith(BEARER) or token == BEARER:
        raise WorkerError(
            "INVALID_ARGUMENT",
            "a request has 3 frames (request id, method, body) and a 4th if it carries a "
            f"token, {BEARER.decode()}<token>; this 4th frame is not one",
        )
    return token.removeprefix(BEARER)


def reply_frames(request_id: int, response: ResponseMessage) -> list[Buffer]:
    """The frames of a successful reply; a batch's payload follows its header as frames of at
    most `PAYLOAD_FRAME_BYTES`, views of the batch's own (no copy)."""
    frame_id = encode_request_id(request_id)
    if isinstance(response, EncodedBatch):
        return [frame_id, OK, response.header.SerializeToString(), *_cut(response.frames)]
    return [frame_id, OK, response.SerializeToString()]


def _cut(frames: Sequence[Buffer]) -> list[Buffer]:
    """`frames`, each one longer than `PAYLOAD_FRAME_BYTES` cut into views of that length."""
    cut: list[Buffer] = []
    for frame in frames:
        if len(frame) <= PAYLOAD_FRAME_BYTES:
            cut.append(frame)
            continue
        view = memoryview(frame).cast("B")
        cut += [
            view[start : start + PAYLOAD_FRAME_BYTES]
            for start in range(0, len(view), PAYLOAD_FRAME_BYTES)
        ]
    return cut


def error_frames(request_id: int, error: WorkerError) -> list[Buffer]:
    body = error_reply(error).SerializeToString()
    return [encode_request_id(request_id), ERROR, body]


def parse_reply(frames: Sequence[Buffer], expected: type[R]) -> Reply[R]:
    """The reply in `frames` to a handshake or info request that expects `expected`.

    An error reply is raised as the worker's `WorkerError` (a `RecordFailed` for a failed record);
    a malformed reply raises one with code BAD_REPLY (DATA_LOSS): the worker's fault.
    """
    what = expected.__name__
    request_id = _parse_status(frames, 3, what)
    return Reply(request_id, _parse(expected, frames[2], what, BAD_REPLY))


def batch_head(head: Buffer, limit: int) -> wire.BatchResponse:
    """The header frame `head` of a batch reply; a BAD_REPLY `WorkerError` if `head` is not a
    `BatchResponse` or declares a payload of more than `limit` bytes."""
    header = _parse(wire.BatchResponse, head, "BatchResponse", BAD_REPLY)
    if header.payload_size > limit:
        raise WorkerError(
            BAD_REPLY,
            f"a batch reply declares a payload of {header.payload_size} bytes, more than {limit}",
        )
    return header


def parse_batch_reply(frames: Sequence[Buffer]) -> BatchReply:
    """The reply in `frames` to a batch request; errors as in `parse_reply`.

    The payload is not copied: `loadax.wire.codec.decode_frames(reply.payload)` gives arrays that
    view it (received into one buffer, see `batch_head`; as sent, an array larger than
    `PAYLOAD_FRAME_BYTES` spans frames).
    """
    request_id = _parse_status(frames, 3, "BatchResponse", more_allowed=True)
    header = _parse(wire.BatchResponse, frames[2], "BatchResponse", BAD_REPLY)
    if header.shared_memory:  # its payload is in the client's memory file
        _require_count(frames, 3, "a BatchResponse reply in shared memory")
    elif len(frames) < 4:
        _require_count(frames, 4, "a BatchResponse reply")
    payload = [memoryview(frame).toreadonly() for frame in frames[3:]]
    return BatchReply(request_id, header, payload)


def _parse_status(
    frames: Sequence[Buffer], count: int, what: str, more_allowed: bool = False
) -> int:
    """The request id of a successful reply of `count` frames (or more, with `more_allowed`);
    an error reply is raised."""
    if len(frames) < 3:
        raise WorkerError(BAD_REPLY, f"a reply has at least 3 frames, got {len(frames)}")
    try:
        request_id = parse_request_id(frames[0])
    except WorkerError as error:
        raise WorkerError(BAD_REPLY, error.message) from None
    status = bytes(frames[1])
    if status == ERROR:
        _require_count(frames, 3, "an error reply")
        raise error_from_reply(_parse(wire.ErrorReply, frames[2], "ErrorReply", BAD_REPLY))
    if status != OK:
        raise WorkerError(BAD_REPLY, f"unknown reply status {status[:40]!r}")
    if not (more_allowed and len(frames) > count):
        _require_count(frames, count, f"a {what} reply")
    return request_id


def _require_count(frames: Sequence[Buffer], count: int, what: str) -> None:
    if len(frames) != count:
        raise WorkerError(BAD_REPLY, f"{what} has {count} frames, got {len(frames)}")


def _parse(kind: type[M], body: Buffer, what: str, code: str = "INVALID_ARGUMENT") -> M:
    """The message of type `kind` in `body`; a malformed one is a `WorkerError` with `code`."""
    message = kind()
    try:
        message.ParseFromString(bytes(body))  # small: payloads never pass through here
    except DecodeError as error:
        raise WorkerError(
            code, f"the body of {what} is not a valid {kind.__name__}: {error}"
        ) from error
    return message
