"""A ZeroMQ client's requests while they wait for their replies: what the I/O thread keeps of each
(`Pending`), how a reply's frames become its result, and how a request fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from loadax.client.transports.memory_files import Lease
from loadax.client.transports.reply import Reply
from loadax.errors import WorkerError
from loadax.wire import zmq_frames
from loadax.wire.failures import BAD_REPLY

T = TypeVar("T")
Frames = Sequence[bytes | memoryview]


@dataclasses.dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """A request sent, or to be sent, and what becomes of its reply."""

    future: Future[T]
    # The reply's frames and its payload's checksum if computed -> the result; raises the
    # worker's WorkerError.
    complete: Callable[[Frames, int | None], T]
    # Whether the request waits for a connection rather than failing at once without one.
    patient: bool
    # Whether the reply is a batch, whose payload is received into a pooled buffer.
    batch: bool = False
    # Whether the reply may come on the data socket (`loadax.wire.zmq_data`): lost with it.
    data: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """A cancel of the request `request_id`, for the I/O thread to send; `anyway`: even if it
    did not send the request (it may have gone on the data socket), so that the cancel comes
    before what follows on the DEALER (e.g. a handshake, which counts against the limit)."""

    request_id: int
    anyway: bool = False


def batch_reply(frames: Frames, checksum: int | None) -> Reply:
    """The header and payload of the batch reply `frames` (with the payload's `checksum`); the
    worker's error raised."""
    reply = zmq_frames.parse_batch_reply(frames)
    return Reply(reply.header, reply.payload, checksum)


def reply_of(kind: type[zmq_frames.R]) -> Callable[[Frames, int | None], zmq_frames.R]:
    """How the frames of a reply that answers with a `kind` become it; the worker's error
    raised."""
    return lambda frames, _: zmq_frames.parse_reply(frames, kind).response


def complete(
    entry: Pending[Any], worker: str, received: Callable[[], tuple[Frames, int | None]]
) -> None:
    """Complete `entry` with its reply from `worker`: the frames and payload checksum that
    `received()` gives. The worker's error fails it, and so does anything else that goes wrong,
    as BAD_REPLY (a reply that does not hold)."""
    settle(entry, worker, lambda: entry.complete(*received()))


def settle(entry: Pending[Any], worker: str, result: Callable[[], Any]) -> None:
    """Complete `entry` with what `result()` gives (its reply from `worker`, made); its
    `WorkerError` fails it, and so does anything else it raises, as BAD_REPLY."""
    try:
        value = result()
    except WorkerError as error:
        fail(entry.future, error)
    except Exception as error:
        fail(entry.future, WorkerError(BAD_REPLY, f"bad reply from {worker}: {error}"))
    else:
        if entry.future.set_running_or_notify_cancel():
            entry.future.set_result(value)


def fail(future: Future[Any], error: Exception) -> None:
    # A cancelled future has nobody waiting for it.
    if future.set_running_or_notify_cancel():
        future.set_exception(error)


def shared_batch_reply(
    lease: Lease, worker: str, max_bytes: int
) -> Callable[[Frames, int | None], Reply]:
    """How the frames of the reply to the request of `lease` (a batch request that names a
    memory file) become its `Reply`: its payload a view of the file, if the worker wrote it."""

    def complete(frames: Frames, checksum: int | None) -> Reply:
        reply = batch_reply(frames, checksum)
        return lease.reply(worker, reply.header, reply.payload, reply.checksum, max_bytes)

    return complete
