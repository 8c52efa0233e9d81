"""What a gRPC call to a worker answers, as a transport hands it over: a batch call's messages
as a `Reply` (one unary reply, a stream, a stream whose payload is in the client's memory file or
on its data socket), and a failed call as the worker's `WorkerError`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import grpc
from google.protobuf.message import DecodeError

from loadax.client.transports.memory_files import Lease
from loadax.client.transports.reply import Reply
from loadax.errors import WorkerError
from loadax.wire.failures import ERROR_METADATA, error_from_reply
from loadax.wire.limits import MAX_BATCH_BYTES
from loadax.wire.payloads import ChecksummedStream, MalformedReply, parse_payload_reply, read_stream
from loadax.wire.v1 import worker_pb2 as wire


def unless_on_data_socket(
    messages: Iterator[bytes], take: Callable[[int], memoryview]
) -> Reply | None:
    """The reply of a `STREAM_BATCH` call's `messages` whose request asks for its reply on the
    data socket, as `streamed_reply`; None if it ends with no message (its reply went there)."""
    first = next(messages, None)
    if first is None:
        return None
    return streamed_reply(itertools.chain([first], messages), take)


def unary_reply(call: Iterator[bytes]) -> Reply:
    """The header and the payload of the `LOAD_BATCH_PAYLOAD` call `call`, once it ends."""
    replies = list(call)
    if len(replies) != 1:
        raise MalformedReply(f"LoadBatchPayload answered {len(replies)} messages, not one")
    header, payload = parse_payload_reply(replies[0])
    return Reply(header, [payload])


def shared_reply(
    messages: Iterator[bytes], take: Callable[[int], memoryview], lease: Lease, worker: str
) -> Reply:
    """The reply of a `STREAM_BATCH` call's `messages` whose request names the memory file of
    `lease`: its payload a view of that file (or, if the worker sent it, as `streamed_reply`)."""
    reply = streamed_reply(messages, take)
    return lease.reply(worker, reply.header, reply.payload, reply.checksum, MAX_BATCH_BYTES)


def streamed_reply(messages: Iterator[bytes], take: Callable[[int], memoryview]) -> Reply:
    """The header and the payload of a `STREAM_BATCH` call's `messages` (segments larger than a
    message joined into `take(size)`), checksummed as each message comes."""
    stream = ChecksummedStream(messages)
    header, segments = read_stream(stream, take)
    return Reply(header, segments, stream.value())


def worker_error(error: grpc.RpcError) -> WorkerError:
    """The worker's error: its `ErrorReply` when the call's trailing metadata carries one (a
    failed record), else its status."""
    # The error of a call is also the call itself.
    metadata = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    for key, value in metadata or ():
        if key == ERROR_METADATA and isinstance(value, bytes):
            try:
                return error_from_reply(wire.ErrorReply.FromString(value))
            except DecodeError:
                break  # the status still says what failed
    code = error.code()
    return WorkerError(code.name if code is not None else "UNKNOWN", error.details() or "")
