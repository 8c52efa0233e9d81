"""Reading replies off a ZeroMQ client's DEALER socket, each handed to the request it answers: a
batch's payload frames received into one pooled buffer of the size its header declares, checked
as they come, and checksummed as each lands (while it is in the CPU's cache)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import zmq

from loadax.buffers import BufferPool
from loadax.client.transports.zmq_pending import Pending, complete
from loadax.errors import WorkerError
from loadax.wire import zmq_frames
from loadax.wire.checksum import available, new_hasher
from loadax.wire.failures import BAD_REPLY

Frames = list[bytes | memoryview]
log = logging.getLogger(__name__)


class ReplyReader:
    """Reads the frames of replies from the worker `name` off `socket` (on the thread that owns
    it); a batch's payload goes into a buffer of `buffers`, and is refused beyond `max_payload`
    bytes before anything is allocated for it."""

    def __init__(
        self, socket: zmq.Socket[bytes], name: str, buffers: BufferPool, max_payload: int
    ) -> None:
        self._socket = socket
        self._name = name
        self._buffers = buffers
        self._max_payload = max_payload

    def replies(self, most: int, answered: Callable[[int], Pending[Any] | None]) -> bool:
        """Read the replies waiting, up to `most`, each completing the request `answered(id)`
        gives for its request id (None: none waits for it, the reply is dropped): whether all
        were read."""
        for _ in range(most):
            try:
                first = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            # The rest of a message is there as soon as its first frame is (ZeroMQ delivers
            # whole messages), and must be read before the next message, whatever happens.
            try:
                request_id = zmq_frames.parse_request_id(first)
            except WorkerError as error:
                self.discard_rest()
                log.debug("dropped a reply from %s: %s", self._name, error)
                continue
            entry = answered(request_id)
            if entry is None:
                self.discard_rest()
                log.debug("dropped a reply from %s to unknown request %d", self._name, request_id)
                continue
            complete(entry, self._name, functools.partial(self._frames, first, entry.batch))
        return False

    def _frames(self, first: bytes, batch: bool) -> tuple[Frames, int | None]:
        """The frames of the reply whose first frame is `first`, and its payload's checksum."""
        rest, checksum = self.rest(batch)
        return [first, *rest], checksum

    def rest(self, batch: bool) -> tuple[Frames, int | None]:
        """The frames of a reply after its request id, and its payload's checksum (None if not
        computed). Those of a successful `batch` reply after its header (the payload) come as
        one frame: the buffer of the pool they were received into, one after the other, with
        their checksum of the kind the header names."""
        frames: Frames = []
        checksum: int | None = None
        while self._socket.getsockopt(zmq.RCVMORE):
            if batch and len(frames) == 2 and frames[0] == zmq_frames.OK:
                payload, checksum = self._payload(frames[1])
                frames.append(payload)
                break
            frames.append(self._socket.recv())
        return frames, checksum

    def _payload(self, head: bytes | memoryview) -> tuple[memoryview, int | None]:
        """The rest of a batch reply (its payload frames) received into one pooled buffer of the
        size its header `head` declares, and their checksum (None: a kind this process cannot
        compute, for the decoder to refuse). More bytes than that would be cut short by ZeroMQ
        (it tells how long a frame was): a BAD_REPLY naming both sizes, never a truncated
        batch."""
        try:
            header = zmq_frames.batch_head(head, self._max_payload)
        except WorkerError:
            self.discard_rest()
            raise
        size = header.payload_size
        hasher = new_hasher(header.checksum_kind) if available(header.checksum_kind) else None
        buffer = self._buffers.take(size)
        received = 0
        while True:
            length = self._socket.recv_into(buffer[received:])
            if length > size - received:
                self.discard_rest()
                raise WorkerError(
                    BAD_REPLY,
                    f"{self._name} sent a batch reply whose payload frames hold more than the "
                    f"{size} bytes its header declares: a frame of {length} bytes came with "
                    f"{size - received} left",
                )
            if hasher is not None:
                hasher.update(buffer[received : received + length])
            received += length
            if not self._socket.getsockopt(zmq.RCVMORE):
                return buffer[:received], None if hasher is None else hasher.value()

    def discard_rest(self) -> None:
        """Read the frames left of the message being received, keeping none."""
        while self._socket.getsockopt(zmq.RCVMORE):
            self._socket.recv_into(bytearray())
