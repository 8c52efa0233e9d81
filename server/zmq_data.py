"""The worker's data port (`loadax.wire.zmq_data`): a plain TCP listener beside the ROUTER socket
or the gRPC port whose connections carry batch replies straight to their clients' buffers.

The ZeroMQ server's I/O thread (the gRPC server's data thread: `loadax.server.grpc_data`)
accepts connections, reads their hellos (without blocking, each within `HELLO_TIMEOUT_S`) and
watches the connections it took: for their end, and on a port that takes requests (ZeroMQ's),
for the messages that carry requests and cancels, each handed to the server as from the
connection that shook hands. Handler threads send replies on them (`send`), one at a time per
connection, each within `SEND_TIMEOUT_S`. A hello is taken on its nonce alone (offered only to a
handshake that passed the token check); the token an older client still sends after it is read
and ignored. Whatever a peer sends (a bad hello, a nonce never offered or spent, bytes that do not
frame a message, or any on a port that takes none, an early close), the worker logs it and closes
that connection; nothing else is touched.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from loadax.server.throttled_log import ThrottledLog
from loadax.wire import zmq_data
from loadax.wire.payloads import EncodedBatch

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0
"""How long a connection may take to send its hello."""
SEND_TIMEOUT_S = 30.0
"""How long a reply may wait for its client to make room for it; then its connection is closed."""
_MAX_GREETINGS = 64  # connections whose hello is awaited; more are closed as they come
_MAX_NONCES = 4096  # nonces offered and not used yet (the oldest are forgotten)
_MAX_BUFFERS = 512  # buffers per sendmsg call (Linux takes at most 1024)
_READ_BYTES = 64 << 10  # read from a connection per turn of the I/O thread

Take = Callable[[bytes, list[memoryview]], None]
"""What the server does with the frames of a request or cancel that came on the data socket of
the connection of routing identity (the first argument)."""


class DataPort:
    """The data port of a server bound to `host` (its endpoint's: "" for every address), on
    `port` (0: any free port); with `max_message`, it takes requests of up to that many bytes
    on its data sockets (`serve`'s `take`), else none."""

    def __init__(self, host: str, port: int, max_message: int | None = None) -> None:
        self._address = (host, port)
        self._max_message = max_message
        self._listener: socket.socket | None = None
        self.port = 0  # once open: the port bound
        self._warnings = ThrottledLog(log)
        # The nonces offered, by routing identity, and the connections taken: handler threads
        # use them, the I/O thread changes them.
        self._lock = threading.Lock()
        self._nonces: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
        # The pipelines each routing identity (or key) shook hands for, the latest last.
        self._pipelines: collections.OrderedDict[bytes, set[str]] = collections.OrderedDict()
        self._connections: dict[bytes, _Connection] = {}
        # Owned by the I/O thread: its poller, and the connections whose hello is awaited.
        self._poller: zmq.Poller | None = None
        self._greetings: dict[int, _Greeting] = {}  # by file descriptor

    def open(self) -> int:
        """Bind and listen; the port bound. An OSError if it cannot (e.g. the port is taken)."""
        host, port = self._address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            listener = socket.create_server((host, port), family=family, backlog=64)
        except OSError as error:
            raise OSError(f"cannot bind the data port to {host}:{port}: {error}") from error
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        return self.port

    def offer(self, identity: bytes, pipeline: str) -> bytes:
        """A nonce for a data socket of the connection of routing `identity` (ZeroMQ's), or of
        the client's key (gRPC's), from a handler thread answering its handshake for
        `pipeline`, which requests on the socket may then ask for (`may_ask`)."""
        nonce = secrets.token_bytes(zmq_data.NONCE_BYTES)
        with self._lock:
            self._nonces[nonce] = identity
            while len(self._nonces) > _MAX_NONCES:
                self._nonces.popitem(last=False)
            self._pipelines.setdefault(identity, set()).add(pipeline)
            self._pipelines.move_to_end(identity)
            while len(self._pipelines) > _MAX_NONCES:
                self._pipelines.popitem(last=False)
        return nonce

    def may_ask(self, identity: bytes, pipeline: str) -> bool:
        """Whether a request on the data socket of the connection `identity` may ask for
        `pipeline`: one that connection shook hands for (its token checked)."""
        with self._lock:
            return pipeline in self._pipelines.get(identity, ())

    def send(self, identity: bytes, request_id: int, batch: EncodedBatch) -> bool:
        """Send the reply `batch` to the request `request_id` on the data socket of the
        connection of routing `identity` or key (from a handler thread): False if it has none
        (nothing was sent: send it on the request's own connection). A reply cut short (its
        client gone or too slow) closes the data socket, which fails the client's requests that
        wait on it."""
        with self._lock:
            connection = self._connections.get(identity)
        return connection is not None and connection.send(request_id, batch)

    @property
    def takes_requests(self) -> bool:
        """Whether clients may send requests on its data sockets (`data_requests`)."""
        return self._max_message is not None

    def attach(self, poller: zmq.Poller) -> None:
        """Watch the listener (open) on `poller`, the I/O thread's."""
        self._poller = poller
        if self._listener is not None:
            self._register(self._listener)

    def timeout_ms(self, now: float) -> int | None:
        """How soon the I/O thread must call `serve` for a hello's deadline (None: no hello is
        awaited)."""
        if not self._greetings:
            return None
        first = min(greeting.deadline for greeting in self._greetings.values())
        return max(0, int(1000 * (first - now)) + 1)

    def serve(self, ready: dict[Any, int], now: float, take: Take | None = None) -> None:
        """Take the listener's and the connections' news that `ready` (the poller's: a plain
        socket's by its file descriptor) holds, handing the requests that came to `take` (on
        a port that takes them), and close the connections whose hello is late; on the I/O
        thread."""
        with self._lock:
            taken = [c for c in self._connections.values() if c.fd in ready]
        for connection in taken:
            self._on_news(connection, take)
        greetings = [self._greetings[key] for key in ready if key in self._greetings]
        for greeting in greetings:
            self._greet(greeting)
        if self._listener is not None and self._listener.fileno() in ready:
            self._accept(self._listener, now)
        for greeting in [g for g in self._greetings.values() if g.deadline <= now]:
            self._refuse(greeting, f"no hello within {HELLO_TIMEOUT_S} s")

    def close(self) -> None:
        """Close the listener and every connection (the worker stops); on the I/O thread."""
        for greeting in list(self._greetings.values()):
            self._drop_greeting(greeting)
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            self._forget(connection)
        if self._listener is not None:
            self._unregister(self._listener)
            self._listener.close()
            self._listener = None

    def _accept(self, listener: socket.socket, now: float) -> None:
        for _ in range(_MAX_GREETINGS):
            try:
                peer, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # e.g. out of file descriptors: the others are served
                self._warnings.warning(("accept",), "cannot accept a data socket: %s", error)
                return
            name = _peer_name(address)
            if len(self._greetings) >= _MAX_GREETINGS:
                self._warnings.warning(
                    (name, "greetings"),
                    "closed a data socket from %s: %d others have not sent their hello yet",
                    name,
                    _MAX_GREETINGS,
                )
                peer.close()
                continue
            peer.setblocking(False)
            greeting = _Greeting(peer, name, now + HELLO_TIMEOUT_S)
            self._greetings[peer.fileno()] = greeting
            self._register(peer)

    def _greet(self, greeting: _Greeting) -> None:
        """Read what `greeting`'s peer sent of its hello; once whole, take or refuse it."""
        try:
            received = greeting.socket.recv(greeting.wanted() - len(greeting.received))
            if not received:
                raise zmq_data.DataSocketError("it closed before its hello was whole")
            greeting.received += received
            if len(greeting.received) < greeting.wanted():
                return
            identity = self._check(greeting)
        except (BlockingIOError, InterruptedError):
            return
        except (OSError, zmq_data.DataSocketError) as error:
            self._refuse(greeting, str(error))
            return
        self._drop_greeting(greeting, close=False)
        greeting.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            greeting.socket.send(zmq_data.ACCEPTED)  # a few bytes into an empty socket buffer
        except OSError as error:
            log.debug("a data socket from %s closed as it was taken: %s", greeting.name, error)
            greeting.socket.close()
            return
        # Replies are sent by blocking calls, each ended by the kernel after `SEND_TIMEOUT_S`
        # without room (a Python loop of waits costs a wake-up of the interpreter per ACK); the
        # I/O thread's reads never block (MSG_DONTWAIT).
        greeting.socket.setblocking(True)
        seconds = int(SEND_TIMEOUT_S)
        greeting.socket.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0)
        )
        connection = _Connection(greeting.socket, greeting.name, identity)
        with self._lock:
            replaced = self._connections.get(identity)
            self._connections[identity] = connection
        if replaced is not None:
            self._forget(replaced)
        self._register(connection.socket)
        log.debug("took a data socket from %s", greeting.name)

    def _check(self, greeting: _Greeting) -> bytes:
        """The routing identity (or key) whose nonce `greeting`'s whole hello names; a
        `DataSocketError` if none. A token after the nonce (an older client's) is not looked at:
        the nonce was offered only to a handshake whose token was checked, and a check of the
        token here would refuse no one that the nonce lets in."""
        nonce, _ = zmq_data.parse_hello_head(greeting.received[: zmq_data.HELLO_HEAD.size])
        with self._lock:
            identity = self._nonces.pop(nonce, None)
        if identity is None:
            raise zmq_data.DataSocketError("its nonce was never offered, or was used already")
        return identity

    def _on_news(self, connection: _Connection, take: Take | None) -> None:
        """A taken connection is readable: messages came (to `take`), its peer closed it, or it
        sent what it must not."""
        try:
            received = connection.socket.recv(_READ_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            log.debug("the data socket from %s failed: %s", connection.name, error)
        else:
            if not received:
                log.debug("the data socket from %s closed", connection.name)
            elif self._max_message is None or take is None:
                self._warnings.warning(
                    (connection.name, "data"),
                    "closed the data socket from %s: it sent bytes after its hello",
                    connection.name,
                )
            else:
                try:
                    connection.take(received, self._max_message, take)
                    return
                except zmq_data.DataSocketError as error:
                    self._warnings.warning(
                        (connection.name, "data"),
                        "closed the data socket from %s: %s",
                        connection.name,
                        error,
                    )
        with self._lock:
            for identity, known in list(self._connections.items()):
                if known is connection:
                    del self._connections[identity]
        self._forget(connection)

    def _refuse(self, greeting: _Greeting, why: str) -> None:
        self._warnings.warning(
            (greeting.name, "hello"), "refused a data socket from %s: %s", greeting.name, why
        )
        self._drop_greeting(greeting)

    def _drop_greeting(self, greeting: _Greeting, close: bool = True) -> None:
        del self._greetings[greeting.socket.fileno()]
        self._unregister(greeting.socket)
        if close:
            greeting.socket.close()

    def _forget(self, connection: _Connection) -> None:
        self._unregister(connection.socket)
        connection.close()

    def _register(self, peer: socket.socket) -> None:
        if self._poller is not None:
            self._poller.register(peer, zmq.POLLIN)

    def _unregister(self, peer: socket.socket) -> None:
        if self._poller is not None:
            self._poller.unregister(peer)


class _Greeting:
    """A connection whose hello is awaited until `deadline`, and what it sent of it so far."""

    def __init__(self, peer: socket.socket, name: str, deadline: float) -> None:
        self.socket, self.name, self.deadline = peer, name, deadline
        self.received = b""

    def wanted(self) -> int:
        """The bytes of the whole hello, as far as what was received tells."""
        if len(self.received) < zmq_data.HELLO_HEAD.size:
            return zmq_data.HELLO_HEAD.size
        _, token_length = zmq_data.parse_hello_head(self.received[: zmq_data.HELLO_HEAD.size])
        return zmq_data.HELLO_HEAD.size + token_length


class _Connection:
    """A data socket taken, from the peer `name`, for the connection of routing `identity`:
    replies are sent on it one at a time."""

    def __init__(self, peer: socket.socket, name: str, identity: bytes) -> None:
        self.socket, self.name, self.identity = peer, name, identity
        self.fd = peer.fileno()  # as the poller names it
        self._lock = threading.Lock()  # held while a reply is sent
        self._open = True
        self._received = bytearray()  # the I/O thread's: a message not whole yet

    def take(self, received: bytes, max_message: int, take: Take) -> None:
        """Hand each message that `received` completes to `take`, up to `max_message` bytes
        each; a `DataSocketError` once the bytes do not frame one."""
        self._received += received
        head = zmq_data.MESSAGE_HEAD.size
        while len(self._received) >= head:
            length = zmq_data.parse_message_head(self._received[:head], max_message)
            if len(self._received) < head + length:
                return
            body = bytes(self._received[head : head + length])
            del self._received[: head + length]
            take(self.identity, zmq_data.parse_message(memoryview(body)))

    def send(self, request_id: int, batch: EncodedBatch) -> bool:
        """Send the reply `batch`: False if the connection was closed before (nothing sent)."""
        header = batch.header.SerializeToString()
        buffers = [
            memoryview(zmq_data.reply_head(request_id, header)),
            memoryview(header),
            *(memoryview(frame).cast("B") for frame in batch.frames),
        ]
        with self._lock:
            if not self._open:
                return False
            started = time.monotonic()
            try:
                _send_all(self.socket, buffers)
            except OSError as error:
                log.warning(
                    "closed the data socket from %s: the reply to request %d failed after "
                    "%.1f s: %s",
                    self.name,
                    request_id,
                    time.monotonic() - started,
                    error,
                )
                self._shut()
        return True

    def close(self) -> None:
        """Close it, once a reply being sent has stopped (the shutdown ends its wait)."""
        self._shut()
        with self._lock:
            self.socket.close()

    def _shut(self) -> None:
        self._open = False
        with contextlib.suppress(OSError):  # not connected any more
            self.socket.shutdown(socket.SHUT_RDWR)


def _send_all(peer: socket.socket, buffers: list[memoryview]) -> None:
    """Send `buffers`, in order, whole, on the blocking socket `peer` (a `sendmsg` cut short by
    its send timeout sends a part of them); a TimeoutError once one sends nothing in that time."""
    pending = collections.deque(view for view in buffers if len(view))
    while pending:
        try:
            sent = peer.sendmsg(list(pending)[:_MAX_BUFFERS])
        except BlockingIOError:
            raise TimeoutError(f"no room to send for {SEND_TIMEOUT_S} s") from None
        while sent:
            first = pending[0]
            if sent < len(first):
                pending[0] = first[sent:]
                break
            sent -= len(first)
            pending.popleft()


def _peer_name(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
