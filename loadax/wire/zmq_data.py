"""The data socket of the ZeroMQ and gRPC transports, shared by the worker and the client: a plain
TCP connection beside the worker's ROUTER socket or gRPC port that carries successful batch
replies, so that a client receives a payload straight into its own buffer (libzmq receives only
into messages of its own, grpcio into fresh `bytes` of each message: a copy more). Requests,
cancels, errors and heartbeats stay on ZeroMQ or gRPC.

A handshake that asks for it (`HandshakeRequest.data_socket`) is answered with the
worker's data port and a nonce (`HandshakeResponse.data_port`, `data_nonce`). The client connects
to that port on the host it reached the worker at and sends a hello: `HELLO_MAGIC`, the nonce, and
a token's length (uint16), 0: no token follows. The nonce alone authenticates the socket (a worker
with a token offers one only to a handshake that carried it), so the token never goes to whatever
listens on that port (behind a proxy, a program on the proxy's host); a worker reads the token
that an older client still sends, and ignores it. A worker that takes the hello answers
`ACCEPTED` and from then on may send the replies to the requests of the connection that shook
hands, those that ask for it (`BatchRequest.data_socket`), on it; a worker that refuses it closes
the connection (as an older worker with a token does with a hello without it). A nonce is good
for one data socket.

Over gRPC, whose connection a proxy may share between clients, the handshake also names a random
key of the client's (`HandshakeRequest.data_key`, `KEY_BYTES`): the nonce binds the data socket
to that key, and a batch request that asks for its reply there names the key and the id its reply
carries (`BatchRequest.data_key`, `data_id`). Its call, once the reply is on the data socket,
ends after its heartbeats with no message; one answered otherwise (an error, no data socket any
more) is answered on the call as ever.

A reply is `REPLY_HEAD` (its request id, uint64, and its header's length, uint32, big-endian),
the header (a `BatchResponse` whose `payload_size` says how many bytes follow), then the payload.

A ZeroMQ worker that also takes requests there says so at the handshake
(`HandshakeResponse.data_requests`): its client may then send a batch request, or a cancel, on
the data socket instead of its DEALER, as the same frames (`zmq_frames`) without the token, in
one message: `MESSAGE_HEAD` (the bytes that follow, uint32), then each frame as its length
(uint32) and its bytes. The worker takes it as if it came on the connection that shook hands
(whose token was checked), for a pipeline that connection shook hands for only, its refusals
answered over ZeroMQ; the token stays off the socket.
Nothing else goes on the socket, in either direction, after the hello and its answer; a worker
closes one that sends what does not frame a message.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from loadax.wire.credentials import MAX_TOKEN_CHARS

HELLO_MAGIC = b"LDXD\x01"
NONCE_BYTES = 16
KEY_BYTES = 16
ACCEPTED = b"LDXD ok\n"
MAX_HEADER_BYTES = 64 << 10
"""The longest header a reply may declare (a `BatchResponse` without payload is ~100 bytes)."""
HELLO_HEAD = struct.Struct(f">{len(HELLO_MAGIC)}s{NONCE_BYTES}sH")
REPLY_HEAD = struct.Struct(">QI")
MESSAGE_HEAD = FRAME_HEAD = struct.Struct(">I")
MESSAGE_OVERHEAD = 1024 + MAX_TOKEN_CHARS
"""What a request's message may hold beyond its body: the frames' lengths, its id, its method and
its token."""


class DataSocketError(ValueError):
    """Bytes on a data socket that break its framing."""


def hello(nonce: bytes) -> bytes:
    """The hello that opens a data socket, naming `nonce` (and no token).

    >>> from loadax.wire.zmq_data import HELLO_HEAD, hello, parse_hello_head
    >>> sent = hello(b"n" * 16)
    >>> parse_hello_head(sent), len(sent) == HELLO_HEAD.size
    ((b'nnnnnnnnnnnnnnnn', 0), True)
    """
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a data socket's nonce is {NONCE_BYTES} bytes, got {len(nonce)}")
    return HELLO_HEAD.pack(HELLO_MAGIC, nonce, 0)


def parse_hello_head(head: bytes) -> tuple[bytes, int]:
    """The nonce and the length of the token that follows (an older client's, to be skipped)
    that the first `HELLO_HEAD.size` bytes of a hello declare; a `DataSocketError` if they are
    not a hello."""
    magic, nonce, token_length = HELLO_HEAD.unpack(head)
    if magic != HELLO_MAGIC:
        raise DataSocketError(f"a data socket's hello starts {HELLO_MAGIC!r}, got {magic!r}")
    if token_length > MAX_TOKEN_CHARS:
        raise DataSocketError(
            f"a data socket's hello declares a token of {token_length} bytes, more than "
            f"{MAX_TOKEN_CHARS}"
        )
    return nonce, token_length


def reply_head(request_id: int, header: bytes) -> bytes:
    """What precedes the header of the reply to the request `request_id` on a data socket."""
    return REPLY_HEAD.pack(request_id, len(header))


def parse_reply_head(head: bytes | bytearray) -> tuple[int, int]:
    """The request id and the header's length that `REPLY_HEAD` bytes declare; a
    `DataSocketError` for a header longer than `MAX_HEADER_BYTES`.

    >>> from loadax.wire.zmq_data import parse_reply_head, reply_head
    >>> parse_reply_head(reply_head(7, b"header"))
    (7, 6)
    """
    request_id, length = REPLY_HEAD.unpack(head)
    if length > MAX_HEADER_BYTES:
        raise DataSocketError(
            f"a reply on the data socket declares a header of {length} bytes, more than "
            f"{MAX_HEADER_BYTES}"
        )
    return request_id, length


def message(frames: Sequence[bytes | memoryview]) -> bytes:
    """The message on a data socket that carries the request or cancel `frames`."""
    body = b"".join(FRAME_HEAD.pack(len(frame)) + bytes(frame) for frame in frames)
    return MESSAGE_HEAD.pack(len(body)) + body


def parse_message_head(head: bytes | bytearray | memoryview, max_bytes: int) -> int:
    """The length of the message that `MESSAGE_HEAD` bytes declare; a `DataSocketError` beyond
    `max_bytes`."""
    length: int = MESSAGE_HEAD.unpack(head)[0]
    if length > max_bytes:
        raise DataSocketError(
            f"a message on the data socket declares {length} bytes, more than {max_bytes}"
        )
    return length


def parse_message(body: memoryview) -> list[memoryview]:
    """The frames of a message's `body` (what follows its head); a `DataSocketError` if they do
    not fill it exactly.

    >>> from loadax.wire.zmq_data import MESSAGE_HEAD, message, parse_message
    >>> sent = message([b"id", b"", b"body"])
    >>> [bytes(frame) for frame in parse_message(memoryview(sent)[MESSAGE_HEAD.size :])]
    [b'id', b'', b'body']
    """
    frames: list[memoryview] = []
    at = 0
    while at < len(body):
        if at + FRAME_HEAD.size > len(body):
            raise DataSocketError("a message on the data socket ends inside a frame's length")
        (length,) = FRAME_HEAD.unpack(body[at : at + FRAME_HEAD.size])
        at += FRAME_HEAD.size
        if at + length > len(body):
            raise DataSocketError(
                f"a message on the data socket declares a frame of {length} bytes, past its end"
            )
        frames.append(body[at : at + length])
        at += length
    return frames
