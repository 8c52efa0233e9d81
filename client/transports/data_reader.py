"""Reading a data socket's replies (`loadax.wire.zmq_data`) on the process's ZeroMQ I/O thread,
without blocking: each payload received with `recv_into` straight into a pooled buffer of the size
its header declares, and checksummed piece by piece as it lands."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from loadax.buffers import BufferPool
from loadax.client.transports.reply import Reply
from loadax.client.transports.zmq_pending import Pending, batch_reply, complete, fail, settle
from loadax.errors import WorkerError
from loadax.wire import zmq_data, zmq_frames
from loadax.wire.checksum import Hasher, available, new_hasher
from loadax.wire.failures import BAD_REPLY
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)

Answered = Callable[[int], "Pending[Any] | None"]
"""The request that a reply's request id answers, no longer pending (None: none waits for it)."""
_TURN_BYTES = 16 << 20  # read per turn of the I/O thread, so that other workers are served too
# The most bytes a reply's payload waits for before it is read on, and the most received at
# once, hashed right after while they are in the CPU's cache (XXH3 runs at 16 GB/s over bytes out
# of it here, at 50 over 2 MiB just received; 4 MiB would leave the cache). From 256 KiB pieces
# woken at 512 KiB, 2 MiB took a T1 batch of 8 MiB 17 receive calls instead of 65, and 5-11 % of
# the client's CPU per GB (paired medians, T1 and R1 over ZeroMQ and gRPC, 4 rounds each).
_LOW_WATER = _PIECE_BYTES = 2 << 20


class DataReader:
    """Reads the replies on the data socket `peer` of the worker `name` when the I/O thread
    serves it (a `zmq_io.Target`): each payload into a buffer of `buffers`, refused beyond
    `max_payload` bytes before anything is allocated for it, completing the request that
    `answered(id)` gives for its request id (None: none waits for it, the reply is dropped).
    Once the socket ends or breaks its framing, it calls `closed(self, why)`."""

    def __init__(
        self,
        peer: socket.socket,
        name: str,
        buffers: BufferPool,
        max_payload: int,
        answered: Answered,
        closed: Callable[[DataReader, str], None],
    ) -> None:
        self.socket = peer
        self._name = name
        self._buffers = buffers
        self._max_payload = max_payload
        self._answered, self._closed = answered, closed
        self._low_water = 1
        self._head = bytearray(zmq_data.REPLY_HEAD.size)
        # The reply being read: what of it was received, and, once its head is, the request id
        # and the bytes of its header; once that is whole, the request it answers (None: none
        # waits for it), the header parsed, the payload's buffer and its checksum.
        self._received = 0
        self._request_id = 0
        self._head_bytes: bytearray | None = None
        self._header: wire.BatchResponse | None = None
        self._entry: Pending[Any] | None = None
        self._payload: memoryview | None = None
        self._hasher: Hasher | None = None

    def serve(self) -> bool:
        """Read what has come: whether more may be waiting (this turn's share was read)."""
        if self.socket.fileno() < 0:
            return False  # closed (by the transport) in this turn of the I/O thread
        budget = _TURN_BYTES
        try:
            while budget > 0:
                if self._payload is not None:
                    budget -= self._read_payload(self._payload, budget)
                    continue
                target = self._target()
                length = self.socket.recv_into(target)
                if not length and len(target):
                    raise zmq_data.DataSocketError("the worker closed it")
                budget -= length
                self._took(target, length)
        except (BlockingIOError, InterruptedError):
            self._wake_at(len(self._target()))
            return False
        except (OSError, zmq_data.DataSocketError, WorkerError) as error:
            why = error.message if isinstance(error, WorkerError) else str(error)
        except Exception as error:  # a bug: the I/O thread serves the other sockets on
            log.exception("reading the data socket of %s failed", self._name)
            why = f"reading it failed: {error!r}"
        else:
            return True
        self.abandon(why)
        self._closed(self, why)
        return False

    def _read_payload(self, payload: memoryview, budget: int) -> int:
        """Receive the rest of `payload` in pieces, each hashed as it lands, up to `budget`
        bytes (more once a piece is under way): the bytes received. The reply is completed
        once whole; BlockingIOError once nothing more has come."""
        receive, hasher, size = self.socket.recv_into, self._hasher, len(payload)
        start = received = self._received
        try:
            while received < size and received - start < budget:
                length = receive(payload[received:], min(size - received, _PIECE_BYTES))
                if not length:
                    raise zmq_data.DataSocketError("the worker closed it")
                if hasher is not None:
                    hasher.update(payload[received : received + length])
                received += length
        finally:
            self._received = received
        if received == size:
            self._complete()
        return received - start

    def _wake_at(self, wanted: int) -> None:
        """Have the socket readable (for the I/O thread) only once `wanted` bytes have come, up
        to `_LOW_WATER`: a turn of the I/O thread per few kernel segments costs more than the
        copy of them."""
        low_water = max(1, min(wanted, _LOW_WATER))
        if low_water != self._low_water:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, low_water)
            self._low_water = low_water

    def abandon(self, why: str) -> None:
        """Fail the request whose reply was being read, if any (the socket ended, for `why`)."""
        entry, self._entry = self._entry, None
        if entry is not None:
            fail(
                entry.future,
                WorkerError(
                    "UNAVAILABLE", f"lost the connection to {self._name} (its data socket): {why}"
                ),
            )

    def _target(self) -> memoryview:
        """Where the next bytes go: the rest of the reply's head, header or payload."""
        if self._payload is not None:
            return self._payload[self._received :]
        if self._head_bytes is not None:
            return memoryview(self._head_bytes)[self._received :]
        return memoryview(self._head)[self._received :]

    def _took(self, target: memoryview, length: int) -> None:
        """`length` bytes of the reply's head or header landed at the start of `target`."""
        self._received += length
        if length < len(target):
            return
        if self._head_bytes is None:
            self._request_id, header_length = zmq_data.parse_reply_head(self._head)
            self._head_bytes = bytearray(header_length)
            self._received = 0
            if header_length:
                return
        self._start_payload(self._head_bytes)

    def _start_payload(self, head: bytearray) -> None:
        """The header `head` is whole: find its request and take the payload's buffer."""
        header = zmq_frames.batch_head(memoryview(head), self._max_payload)
        self._entry = self._answered(self._request_id)
        if self._entry is not None and not self._entry.data:
            fail(
                self._entry.future,
                WorkerError(
                    BAD_REPLY,
                    f"{self._name} answered a request on its data socket that did not ask "
                    "for it there",
                ),
            )
            self._entry = None
        # A payload written into the client's memory file is not on the socket.
        size = 0 if header.shared_memory else header.payload_size
        kind = header.checksum_kind
        waited = self._entry is not None and available(kind) and size > 0
        self._hasher = new_hasher(kind) if waited else None
        self._header = header
        self._payload = self._buffers.take(size) if size else memoryview(b"")
        self._received = 0
        if not size:
            self._complete()

    def _complete(self) -> None:
        """The payload is whole: complete its request, and wait for the next reply."""
        entry, head, header = self._entry, self._head_bytes, self._header
        payload, hasher = self._payload, self._hasher
        self._entry, self._head_bytes, self._header = None, None, None
        self._payload, self._hasher = None, None
        self._received = 0
        if entry is None or head is None or header is None or payload is None:
            return  # nobody waits for it (cancelled, or failed already): dropped
        checksum = None if hasher is None else hasher.value()
        if entry.complete is batch_reply:  # its reply as it is: no frames made, parsed again
            reply = Reply(header, (payload.toreadonly(),), checksum)
            settle(entry, self._name, lambda: reply)
            return
        frames: list[bytes | memoryview] = [
            zmq_frames.encode_request_id(self._request_id),
            zmq_frames.OK,
            bytes(head),
        ]
        if not header.shared_memory:  # else the payload is in the client's memory file
            frames.append(payload)
        complete(entry, self._name, lambda: (frames, checksum))
