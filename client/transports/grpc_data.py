"""The data socket of a gRPC transport (`loadax.wire.zmq_data`): batch replies on a plain TCP
connection beside the worker's gRPC port, each payload received straight into a pooled buffer and
checksummed as it lands, by the process's I/O thread (`zmq_io`: one thread for every data socket
and ZeroMQ socket of the process, started for the first handshake that offers a data socket and
ended with the last transport). Requests, cancels, errors and heartbeats stay on gRPC.

Its opening, reading and loss are the ZeroMQ transport's (`zmq_data.DataChannel`); what differs
is how requests name it: gRPC's connection is no client's own, so the handshake names a random key
of this transport's, and each batch request that asks for its reply on the data socket names the
key and an id of its own, which the reply carries.
"""

from __future__ import annotations

import itertools
import secrets
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future

from loadax.buffers import BufferPool
from loadax.client.transports import zmq_io
from loadax.client.transports.reply import Reply
from loadax.client.transports.zmq_data import DataChannel, flagged
from loadax.client.transports.zmq_pending import Pending, batch_reply, fail
from loadax.errors import WorkerError
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.zmq_data import KEY_BYTES

Handshake = Callable[[wire.HandshakeRequest], wire.HandshakeResponse]


class GrpcDataSocket:
    """The data socket of the transport to the worker `name`: asked for at the handshake
    (`asking`), opened once answered (`learn`), and asked for again with `rehandshake` once lost
    and the worker answers again (`answered_elsewhere`). Payloads go into buffers of `buffers`,
    refused beyond `max_payload` bytes. A batch request that may be answered on it is
    `expect`ed, and its reply completes the future `expect` gives, unless the call's own answer
    comes first (`forget`). A data socket that ends fails every request that may be answered on
    it, with UNAVAILABLE, as a lost connection."""

    def __init__(
        self,
        name: str,
        buffers: BufferPool,
        max_payload: int,
        rehandshake: Handshake,
    ) -> None:
        self._name, self._rehandshake = name, rehandshake
        self._reading = (buffers, max_payload, self.forget)
        self._key = secrets.token_bytes(KEY_BYTES)
        # `_lock` guards what follows, which any thread uses, and orders every wake-up of the I/O
        # thread before `close` lets go of it.
        self._lock = threading.Lock()
        # The process's I/O thread and the channel, from the first handshake that offers one.
        self._io: zmq_io.ZmqIo | None = None
        self._channel: DataChannel | None = None
        self._pending: dict[int, Pending[Reply]] = {}
        self._ids = itertools.count(1)
        self._up = False  # a data socket is open: batch requests ask for their replies on it
        self._handed: list[socket.socket] = []  # opened, for the I/O thread to read
        self._lost_one = False  # one was lost: a new one is asked for once the worker answers
        self._reopen = False  # the I/O thread asks for a new one
        self._closed = False
        self._sockets_closed = threading.Event()

    def asking(self, request: wire.HandshakeRequest) -> wire.HandshakeRequest:
        """The handshake `request` as sent: asking for a data socket, bound to this key."""
        asked = wire.HandshakeRequest()
        asked.CopyFrom(request)
        asked.data_socket, asked.data_key = True, self._key
        return asked

    def learn(
        self, request: wire.HandshakeRequest, response: wire.HandshakeResponse, took_s: float
    ) -> None:
        """The worker answered the handshake `request` (as sent) with `response` in `took_s`
        seconds: open the data socket it offers, unless one is open (`DataChannel.learn`, which
        waits for it a few round trips); batch replies come on their calls until it is open."""
        if not response.data_port:
            return
        with self._lock:
            if self._closed:
                return
            if self._channel is None:  # the process's I/O thread is started by its first user
                self._io = zmq_io.SHARED.acquire()
                self._channel = DataChannel(
                    self._name,
                    True,
                    self._io,
                    self._reading,
                    self._hand_over,
                    self._lost,
                    self._rehandshake,
                    lambda: self._up,
                )
            channel = self._channel
        channel.learn(request, response, took_s)

    def opened(self, timeout: float) -> bool:
        """Whether a data socket is open, once the one being opened (if any) is open or given
        up, waiting for it up to `timeout` seconds."""
        channel = self._channel
        return channel is not None and channel.opened(timeout)

    def expect(
        self, request: wire.BatchRequest
    ) -> tuple[int, wire.BatchRequest, Future[Reply]] | None:
        """The id, the request as sent (`request` asking for its reply on the data socket) and
        the future of its reply there; None when no data socket is open (send `request` as it
        is)."""
        future: Future[Reply] = Future()
        with self._lock:
            if not self._up or self._closed:
                return None
            request_id = next(self._ids)
            self._pending[request_id] = Pending(future, batch_reply, False, batch=True, data=True)
        asked = flagged(request)
        asked.data_key = self._key
        asked.data_id = request_id
        return request_id, asked, future

    def forget(self, request_id: int) -> Pending[Reply] | None:
        """The request `request_id`, which no longer waits for its reply on the data socket (its
        call answered it, failed, or was cancelled); None if the data socket took it already,
        or it failed with it."""
        with self._lock:
            return self._pending.pop(request_id, None)

    def answered_elsewhere(self) -> None:
        """A batch came on its call: a data socket lost since is asked for again (once)."""
        with self._lock:
            if not self._lost_one or self._closed or self._io is None:
                return
            self._lost_one = False
            self._reopen = True
            self._io.wake(self)

    def close(self) -> None:
        """Fail what waits on the data socket with UNAVAILABLE and close it (waiting for the I/O
        thread to, unless called on it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = list(self._pending.values()), {}
            io = self._io
            if io is not None:
                io.wake(self)
        for entry in pending:
            fail(entry.future, WorkerError("UNAVAILABLE", f"{self._name} was closed"))
        if io is not None and not io.on_thread():
            self._sockets_closed.wait()

    def serve(self) -> bool:
        """Read the data sockets handed over, ask for a new one, or close; on the I/O thread
        (which only a channel's handshake wakes for this)."""
        channel, io = self._channel, self._io
        if self._sockets_closed.is_set() or channel is None or io is None:
            return False
        with self._lock:
            handed, self._handed = self._handed, []
            closing, reopen, self._reopen = self._closed, self._reopen, False
        for peer in handed:
            if closing:
                peer.close()
            else:
                channel.adopt(peer)
        if closing:
            channel.close("the transport closed")
            self._sockets_closed.set()
            zmq_io.SHARED.release(io)
        elif reopen:
            channel.reconnected()
        return False

    def _hand_over(self, peer: socket.socket) -> bool:
        """Have the I/O thread read the data socket `peer`: False if closed."""
        with self._lock:
            if self._closed:
                return False
            self._handed.append(peer)
            self._up = True
            if self._io is not None:  # set with the channel that opened `peer`
                self._io.wake(self)
        return True

    def _lost(self, why: str) -> None:
        """The data socket ended, for `why`: what may have been answered on it is lost."""
        with self._lock:
            self._up = False
            self._lost_one = not self._closed
            pending, self._pending = list(self._pending.values()), {}
        message = f"lost the connection to {self._name} (its data socket: {why})"
        for entry in pending:
            fail(entry.future, WorkerError("UNAVAILABLE", message))
