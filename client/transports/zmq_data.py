"""The client's end of a worker's data socket (`loadax.wire.zmq_data`), for the ZeroMQ and gRPC
transports: opened in the background after a handshake that offers one, then read by the
process's ZeroMQ I/O thread beside the DEALER sockets, without blocking: each payload is received
with `recv_into` straight into a pooled buffer of the size its header declares, and checksummed
chunk by chunk as it lands."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from loadax.buffers import BufferPool
from loadax.client.transports.reply import Reply
from loadax.client.transports.zmq_io import ZmqIo
from loadax.client.transports.zmq_pending import Pending, batch_reply, complete, fail, settle
from loadax.errors import WorkerError
from loadax.wire import zmq_data, zmq_frames
from loadax.wire.checksum import Hasher, available, new_hasher
from loadax.wire.failures import BAD_REPLY
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
"""How long opening a data socket (connecting, and the worker's answer to its hello) may take;
then batch replies keep coming over ZeroMQ."""
REHANDSHAKE_S = 5.0
"""How long the handshake for a new data socket, once a worker is back, may take."""
FIRST_WAIT_S = 0.05
"""The most a handshake that offers a data socket waits for it to open before it returns:
`FIRST_WAIT_ROUND_TRIPS` times the handshake's own time, within this. It opens 0.3-2 ms after
the handshake on loopback; the first batches then come on it, not over ZeroMQ (libzmq's messages,
and a copy out of them): T1 over the sockets, the client's CPU up to its first batch 31 -> 21 ms
and over its 64 batches 0.44 -> 0.38 s/GB (medians of 12 fresh processes each, alternated). A
port that answers later (a firewall that drops it) delays its member's first batch by that wait,
once; it goes on opening meanwhile."""
FIRST_WAIT_ROUND_TRIPS = 4
"""Opening a data socket takes two round trips (the connection, the hello and its answer), as a
handshake takes one and the worker's answer to it."""
_TURN_BYTES = 16 << 20  # read per turn of the I/O thread, so that other workers are served too
# The most bytes a reply's payload waits for before it is read on, and the most received at
# once, hashed right after while they are in the CPU's cache (XXH3 runs at 16 GB/s over bytes out
# of it here, at 50 over 2 MiB just received; 4 MiB would leave the cache). From 256 KiB pieces
# woken at 512 KiB, 2 MiB took a T1 batch of 8 MiB 17 receive calls instead of 65, and 5-11 % of
# the client's CPU per GB (paired medians, T1 and R1 over ZeroMQ and gRPC, 4 rounds each).
_LOW_WATER = _PIECE_BYTES = 2 << 20


def flagged(request: wire.BatchRequest) -> wire.BatchRequest:
    """`request`, asking for its reply on the data socket."""
    asked = wire.BatchRequest()
    asked.CopyFrom(request)
    asked.data_socket = True
    return asked


def open_data_socket(address: str, response: wire.HandshakeResponse) -> socket.socket | None:
    """The data socket that the handshake `response` of the worker at `address` ("zmq://host:port"
    or "grpc://host:port") offers, open, its hello (the nonce, no token: whatever listens on the
    port may not be the worker) taken, non-blocking; None if it offers none or it cannot be
    opened (logged: batch replies come over ZeroMQ or gRPC)."""
    if not response.data_port:
        return None
    carrier = "gRPC" if address.startswith("grpc://") else "ZeroMQ"
    host = address.split("://", 1)[-1].rpartition(":")[0].strip("[]")
    try:
        peer = socket.create_connection((host, response.data_port), CONNECT_TIMEOUT_S)
    except OSError as error:
        log.info(
            "%s offers a data socket on port %d that this client cannot reach (%s): batch "
            "replies come over %s",
            address,
            response.data_port,
            error,
            carrier,
        )
        return None
    try:
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer.sendall(zmq_data.hello(response.data_nonce))
        answer = b""
        while len(answer) < len(zmq_data.ACCEPTED):
            received = peer.recv(len(zmq_data.ACCEPTED) - len(answer))
            if not received:
                raise zmq_data.DataSocketError(
                    "the worker closed it: it refused the hello (a worker older than this "
                    "client refuses it when it has a token: it wants the token in the hello)"
                )
            answer += received
        if answer != zmq_data.ACCEPTED:
            raise zmq_data.DataSocketError(f"the worker answered the hello {answer!r}")
    except (OSError, ValueError) as error:
        log.warning(
            "cannot open the data socket to %s: %s; batch replies come over %s",
            address,
            error,
            carrier,
        )
        peer.close()
        return None
    peer.setblocking(False)
    return peer


Answered = Callable[[int], "Pending[Any] | None"]


class DataChannel:
    """The data socket of one transport to the worker `name`, if `enabled`: asked for at the
    handshake (`asking`), opened in the background once answered (`learn`, `opened`), read by
    the I/O thread `io` (`adopt`: a `DataReader` with `buffers`, `max_payload` and `answered`),
    closed with the connection it belongs to (the worker binds it to the connection that shook
    hands), and asked for again once a connection is back (`reconnected`). The transport
    `hand_over(peer)`s a socket opened to the I/O thread (False: the transport is closed), is
    told when one is `lost(why)`, and shakes hands (`rehandshake(request)`) for a new one;
    `up()`: whether one is open. ZeroMQ's transport and gRPC's (`grpc_data`) share it."""

    def __init__(
        self,
        name: str,
        enabled: bool,
        io: ZmqIo,
        reading: tuple[BufferPool, int, Answered],
        hand_over: Callable[[socket.socket], bool],
        lost: Callable[[str], None],
        rehandshake: Callable[[wire.HandshakeRequest], wire.HandshakeResponse],
        up: Callable[[], bool],
    ) -> None:
        self._name, self.enabled, self._io = name, enabled, io
        self._reading = reading
        self._hand_over, self._lost, self._rehandshake = hand_over, lost, rehandshake
        self._up = up
        # Held while one is opened: a handshake and a new one after a reconnection open one.
        self._opening = threading.Lock()
        self._opener: threading.Thread | None = None  # opening the one a handshake offered
        self._reader: DataReader | None = None  # the I/O thread's
        # The handshake that asked for one (None until answered), and whether a new one is
        # being asked for.
        self._asked: wire.HandshakeRequest | None = None
        self._reopening = threading.Event()

    def asking(self, request: wire.HandshakeRequest) -> wire.HandshakeRequest:
        """`request` as sent: asking for a data socket, if enabled."""
        if not self.enabled:
            return request
        asked = wire.HandshakeRequest()
        asked.CopyFrom(request)
        asked.data_socket = True
        return asked

    def learn(
        self, request: wire.HandshakeRequest, response: wire.HandshakeResponse, took_s: float
    ) -> None:
        """The worker answered `request` (as sent) with `response` in `took_s` seconds: open
        the data socket it offers, unless one is open, on a thread of its own, and wait for it
        up to `FIRST_WAIT_ROUND_TRIPS` times that, within `FIRST_WAIT_S`. Until it is open,
        batch replies come over ZeroMQ or gRPC: a port that answers late or never (a firewall
        that drops it; behind a proxy, whose host the client dials, another program's) delays
        the handshake by that wait at most, and no batch after."""
        if not self.enabled:
            return
        self._asked = request
        if not response.data_port:
            return
        opener = threading.Thread(
            target=self._open, args=(response,), name="loadax-data-open", daemon=True
        )
        self._opener = opener
        opener.start()
        opener.join(min(FIRST_WAIT_S, FIRST_WAIT_ROUND_TRIPS * took_s))

    def opened(self, timeout: float) -> bool:
        """Whether a data socket is open, once the one that the last handshake offered is open
        or given up, waiting for it up to `timeout` seconds."""
        opener = self._opener
        if opener is not None:
            opener.join(timeout)
        return self._up()

    def adopt(self, peer: socket.socket) -> None:
        """Read the data socket `peer` from now on; on the I/O thread."""
        if self._reader is not None:
            self._dropped(self._reader, "a new one was opened")
        buffers, max_payload, answered = self._reading
        self._reader = DataReader(peer, self._name, buffers, max_payload, answered, self._dropped)
        self._io.watch(peer, self._reader)

    def reconnected(self) -> None:
        """The connection is up again: ask for a new data socket, unless one is open or being
        asked for; on the I/O thread (the handshake runs on a thread of its own)."""
        request = self._asked
        if request is None or self._up() or self._reopening.is_set():
            return
        self._reopening.set()
        threading.Thread(
            target=self._reopen, args=(request,), name="loadax-data-reopen", daemon=True
        ).start()

    def close(self, why: str) -> None:
        """Close the data socket (for `why`), failing the request whose reply was being read;
        on the I/O thread."""
        if self._reader is not None:
            self._reader.abandon(why)
            self._dropped(self._reader, why)

    def _open(self, response: wire.HandshakeResponse) -> None:
        """Open the data socket that the handshake `response` offers, unless one is open."""
        with self._opening:
            if not self._up():
                peer = open_data_socket(self._name, response)
                if peer is not None and not self._hand_over(peer):
                    peer.close()

    def _reopen(self, request: wire.HandshakeRequest) -> None:
        try:
            self._open(self._rehandshake(request))
        except WorkerError as error:
            log.info("no new data socket to %s: %s", self._name, error)
        finally:
            self._reopening.clear()

    def _dropped(self, reader: DataReader, why: str) -> None:
        """The data socket of `reader` ended, for `why`."""
        if self._reader is not reader:
            return
        self._reader = None
        self._io.unwatch(reader.socket)
        reader.socket.close()
        self._lost(why)


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
        if header.shared_memory:
            raise zmq_data.DataSocketError("a reply on the data socket names a memory file")
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
        kind = header.checksum_kind
        waited = self._entry is not None and available(kind)
        self._hasher = new_hasher(kind) if waited else None
        self._header = header
        self._payload = self._buffers.take(header.payload_size)
        self._received = 0
        if not header.payload_size:
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
        frames = [zmq_frames.encode_request_id(self._request_id), zmq_frames.OK, bytes(head)]
        complete(entry, self._name, lambda: ([*frames, payload], checksum))
