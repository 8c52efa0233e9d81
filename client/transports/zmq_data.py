"""The client's end of a worker's data socket (`loadax.wire.zmq_data`), for the ZeroMQ and gRPC
transports: opened in the background after a handshake that offers one, then read by the
process's ZeroMQ I/O thread beside the DEALER sockets (`data_reader`). To a ZeroMQ worker that
takes them there, the thread that asks sends its batch requests and cancels on it too: one send,
without the I/O thread or libzmq's."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable

from loadax.buffers import BufferPool
from loadax.client.transports.data_reader import Answered, DataReader
from loadax.client.transports.zmq_io import ZmqIo
from loadax.errors import WorkerError
from loadax.wire import zmq_data, zmq_frames
from loadax.wire.messages import RequestMessage
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
        # The open data socket that takes requests, if any; held while one is sent on it, and
        # to let go of it before it is closed.
        self._sending_lock = threading.Lock()
        self._sending: socket.socket | None = None
        self._cut_short: socket.socket | None = None  # shut down for a request cut short
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

    def send_request(self, request_id: int, request: RequestMessage) -> bool:
        """Send `request` of id `request_id` on the data socket (`_send`) if it is a batch
        request for the handshake's pipeline: the worker takes no other there (False: send it
        on ZeroMQ, with the token)."""
        asked = self._asked
        if not (isinstance(request, wire.BatchRequest) and asked is not None):
            return False
        return asked.pipeline == request.pipeline and self._send(
            zmq_frames.request_frames(request_id, request)
        )

    def send_cancel(self, request_id: int) -> bool:
        """Send the cancel of the request `request_id` on the data socket (`_send`)."""
        return self._send(zmq_frames.cancel_frames(request_id))

    def _send(self, frames: list[bytes]) -> bool:
        """Send `frames`, without the token, on the data socket, from any thread: False if none
        is open that takes them, or it has no room (send them on ZeroMQ). One cut short breaks
        the socket's framing: it is shut down, which fails what waits on it."""
        with self._sending_lock:
            peer = self._sending
            if peer is None:
                return False
            message = zmq_data.message(frames)
            try:
                sent = peer.send(message)
            except OSError:  # no room, or the socket failed: its reader tells
                return False
            if sent < len(message):
                self._sending, self._cut_short = None, peer
                with contextlib.suppress(OSError):
                    peer.shutdown(socket.SHUT_RDWR)
            return True

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
            if self._up():
                return
            peer = open_data_socket(self._name, response)
            if peer is None:
                return
            if response.data_requests:  # before requests may ask for their replies on it
                with self._sending_lock:
                    self._sending = peer
            if not self._hand_over(peer):
                self._let_go(peer)
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
        self._let_go(reader.socket)
        if self._cut_short is reader.socket:
            self._cut_short = None
            why = "a request sent on it was cut short (no room: the worker does not read it)"
        reader.socket.close()
        self._lost(why)

    def _let_go(self, peer: socket.socket) -> None:
        """Send nothing more on `peer`, about to be closed."""
        with self._sending_lock:
            if self._sending is peer:
                self._sending = None
