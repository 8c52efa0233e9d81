"""The ZeroMQ transport: `ZmqTransport`, a DEALER socket to one worker.

Framing is `loadax.wire.zmq_frames`. The process's I/O thread (`zmq_io`) serves the DEALER
sockets of every transport (a transport has no thread, and two file descriptors: the socket's
and its connection's, three with a data socket); callers hand it requests through a queue and
wake it. It sends them (`zmq_send`), and receives a batch's payload frames into one buffer of a
`BufferPool` (`zmq_receive`), reused once nothing made from it is alive; or, from a worker that
offers a data socket at the handshake, the whole batch reply on that plain TCP socket, straight
into the buffer (`zmq_data`), where the caller then sends batch requests itself.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import zmq

from loadax.buffers import BufferPool
from loadax.client.security import ClientSecurity
from loadax.client.transports import zmq_io
from loadax.client.transports.memory_files import MemoryFiles, SameHostFiles
from loadax.client.transports.reply import Reply
from loadax.client.transports.zmq_connection import Connection, connect_dealer
from loadax.client.transports.zmq_data import REHANDSHAKE_S, DataChannel, flagged
from loadax.client.transports.zmq_pending import (
    Cancel,
    Frames,
    Pending,
    batch_reply,
    fail,
    reply_of,
    shared_batch_reply,
)
from loadax.client.transports.zmq_receive import ReplyReader
from loadax.client.transports.zmq_send import Outbox, RequestSender
from loadax.errors import WorkerError
from loadax.wire import zmq_frames
from loadax.wire.limits import DEFAULT_TIMEOUT_S, MAX_BATCH_BYTES
from loadax.wire.messages import RequestMessage, method_of
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)

_BURST = 256  # replies taken per turn, so that other workers and submissions are not starved

T = TypeVar("T")


class ZmqTransport:
    """A worker reached over ZeroMQ at "zmq://host:port" (or "tcp://host:port").

    Requests are multiplexed on one connection and matched to replies by request id; ZeroMQ
    reconnects by itself. A worker that is gone, frozen or stopping fails requests at once:
    without a connection (ZeroMQ's IMMEDIATE) a batch request fails with UNAVAILABLE, and one
    lost with its connection, closed by the worker or by missed heartbeats (within
    `ZMQ_HEARTBEAT_TIMEOUT_MS`), fails too. A handshake or an info request waits for a
    connection up to its timeout instead, and so does every request until the first connection.

    With `security.curve_server_key` the connection is CURVE-encrypted, and `security.token`
    goes with every request on it (not on a data socket, which its hello authenticated). A
    worker that refuses the security handshake of the first connection (a CURVE key it does not
    allow, or CURVE on one side only) fails every request with UNAUTHENTICATED, for good.

    A batch's payload is received into a buffer of `buffers` (by default a pool of its own),
    and a reply whose payload is larger than `max_reply_bytes` (by default `MAX_BATCH_BYTES`) is
    refused (BAD_REPLY) before anything is allocated for it; so is one whose payload frames hold
    more than its header declares. A worker on this host writes it into a memory file of `files`
    instead (`send`), unless `shared_memory` is False; one that offers a data socket sends it
    there, unless `data_socket` is False (`handshake`).
    """

    def __init__(
        self,
        address: str,
        security: ClientSecurity | None = None,
        *,
        max_reply_bytes: int | None = None,
        buffers: BufferPool | None = None,
        shared_memory: bool = True,
        files: MemoryFiles | None = None,
        data_socket: bool = True,
    ) -> None:
        self.name = address
        security = security or ClientSecurity()
        self._token = security.token
        self._io = zmq_io.SHARED.acquire()
        try:
            self._dealer, monitor = connect_dealer(
                self._io.context, address, security, max_reply_bytes
            )
        except ValueError:
            zmq_io.SHARED.release(self._io)
            raise
        # Watched for a refused security handshake until the first connection is up.
        self._monitor: zmq.Socket[bytes] | None = monitor
        self._max_reply_bytes = MAX_BATCH_BYTES if max_reply_bytes is None else max_reply_bytes
        self._buffers = buffers or BufferPool()
        self._reader = ReplyReader(self._dealer, address, self._buffers, self._max_reply_bytes)
        # The files a worker on this host writes batches into, once its handshake says it can.
        self._same_host = SameHostFiles(shared_memory, files)
        # `_lock` guards `_pending`, `_closed` and `_refused`, which any thread uses, and orders
        # every wake-up of the I/O thread, and every send on the data socket, before the
        # transport lets go of it.
        self._lock = threading.Lock()
        self._pending: dict[int, Pending[Any]] = {}
        self._closed = False
        self._refused: WorkerError | None = None
        # Whether a data socket is open: batch requests then ask for their replies on it.
        self._data_up = False
        # The I/O thread's: the connection, the requests' sending, whether sockets are watched.
        self._connection = Connection(address, security.curve_server_key is not None)
        self._sender = RequestSender(
            self._dealer, address, self._token, self._connection, self._waiting, self._fail_request
        )
        self._watched = False
        self._data = DataChannel(
            address,
            data_socket,
            self._io,
            (self._buffers, self._max_reply_bytes, self._answered),
            self._hand_over_data,
            self._data_lost,
            lambda request: self._call(request, reply_of(wire.HandshakeResponse), REHANDSHAKE_S),
            lambda: self._data_up,
        )
        # Set once the I/O thread has closed the sockets.
        self._sockets_closed = threading.Event()
        # Requests to send, cancels of requests (their ids), data sockets to read, and None: stop.
        self._outbox: Outbox = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._io.wake(self)

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        """The worker's answer; one that can write into this process's memory files has its
        batches written there from then on (unless `shared_memory` was False); one that offers
        a data socket sends them (or their headers) on it once open, which the handshake waits
        a few round trips for (`DataChannel.learn`), unless `data_socket` was False."""
        request = self._data.asking(self._same_host.handshake(request))
        started = time.monotonic()
        response = self._call(request, reply_of(wire.HandshakeResponse), timeout)
        self._same_host.learn(response)
        if not self._same_host.taken or response.data_requests:  # else it would carry nothing
            self._data.learn(request, response, time.monotonic() - started)
        return response

    def data_socket_open(self, timeout: float) -> bool:
        """Whether batch replies may come on a data socket: one is open, once the one that the
        handshake offered is open or given up (waiting up to `timeout` seconds)."""
        return self._data.opened(timeout)

    def _hand_over_data(self, peer: socket.socket) -> bool:
        """Have the I/O thread read the data socket `peer` (before it sends the requests
        queued after it, which ask for their replies on it): False if closed."""
        with self._lock:
            if self._closed:
                return False
            self._outbox.put(peer)
            self._data_up = True
            self._io.wake(self)
        return True

    def _data_lost(self, why: str) -> None:
        """The data socket ended: the requests that may have been answered on it are lost;
        replies come over ZeroMQ from now on."""
        with self._lock:  # before the requests that ask for it are failed: none is sent after
            self._data_up = False
        self._lose(lambda _, entry: entry.data, f" (its data socket: {why})")

    def info(
        self, request: wire.InfoRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.InfoResponse:
        return self._call(request, reply_of(wire.InfoResponse), timeout)

    def send(self, request: wire.BatchRequest) -> Future[Reply]:
        """A future of the reply; its payload is one read-only view of the buffer it was
        received into, which is not reused while it (or anything made from it without a copy)
        is alive.

        Its exception is a `WorkerError`: the worker's, BAD_REPLY (DATA_LOSS) for framing that
        does not hold, or UNAVAILABLE without a connection to the worker (once there was one),
        with one lost, or once the transport is closed. Cancelling it tells the worker, which
        then lets go of the request without loading it, if it has not started to.

        To a worker on this host (see `handshake`), the request names a memory file of this
        process that the worker writes the payload into, and the payload is a view of it.
        """
        lease = self._same_host.lease(request)
        if lease is None:
            return self._submit(request, batch_reply, patient=False, batch=True)
        complete = shared_batch_reply(lease, self.name, self._max_reply_bytes)
        future = self._submit(lease.request, complete, patient=False, batch=True)
        future.add_done_callback(lease.settle)
        return future

    def close(self) -> None:
        """Fail what is pending with UNAVAILABLE; close the sockets (the I/O thread's: waited)."""
        self._shut_down()
        if not self._io.on_thread():
            self._sockets_closed.wait()

    def __enter__(self) -> ZmqTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(
        self, request: RequestMessage, complete: Callable[[Frames, int | None], T], timeout: float
    ) -> T:
        """The reply to `request`, waiting up to `timeout` for a connection and the answer."""
        future = self._submit(request, complete, patient=True)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            message = f"{self.name} did not answer {method_of(request)} within {timeout} s"
            raise WorkerError("DEADLINE_EXCEEDED", message + self._connection.hint()) from None

    def _submit(
        self,
        request: RequestMessage,
        complete: Callable[[Frames, int | None], T],
        *,
        patient: bool,
        batch: bool = False,
    ) -> Future[T]:
        future: Future[T] = Future()
        request_id = next(self._ids)
        with self._lock:
            if self._closed:
                future.set_exception(WorkerError("UNAVAILABLE", f"{self.name} is closed"))
                return future
            if self._refused is not None:
                future.set_exception(self._refused)
                return future
            # One that may be answered on the data socket (sent there if it can) fails with it.
            data = self._data_up and isinstance(request, wire.BatchRequest)
            asked = flagged(request) if isinstance(request, wire.BatchRequest) and data else request
            self._pending[request_id] = Pending(future, complete, patient, batch, data)
            if not (data and self._data.send_request(request_id, asked)):
                frames = zmq_frames.request_frames(request_id, asked, self._token)
                self._outbox.put((request_id, frames))
                self._io.wake(self)

        def forget(done: Future[T]) -> None:
            """A request cancelled before its answer is forgotten, and the worker told."""
            if not done.cancelled():
                return
            with self._lock:
                entry = self._pending.pop(request_id, None)
                if entry is None or self._closed:
                    return
                # On both sockets, ahead of what comes next on either (the worker takes one).
                self._data.send_cancel(request_id)
                self._outbox.put(Cancel(request_id, anyway=entry.data))
                self._io.wake(self)

        future.add_done_callback(forget)
        return future

    def _shut_down(self) -> None:
        """Mark the target closed and fail what is pending; idempotent, from any thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = list(self._pending.values()), {}
            self._outbox.put(None)
            self._io.wake(self)
        for entry in pending:
            fail(entry.future, WorkerError("UNAVAILABLE", f"{self.name} was closed"))

    def serve(self) -> bool:
        """Serve the worker's sockets, on the I/O thread: send what callers submitted, take the
        connection's news and read replies; whether replies are left for another turn."""
        if self._sockets_closed.is_set():
            return False
        try:
            if not self._watched:
                self._watched = True
                self._io.watch(self._dealer, self)
                if self._monitor is not None:
                    self._io.watch(self._monitor, self)
            if not self._sender.take(self._outbox, self._data.adopt):  # close() was called
                self._close_sockets()
                return False
            if self._monitor is not None:
                self._on_monitor_events(self._monitor)
            return self._on_socket_events()
        except Exception:
            log.exception("the ZeroMQ I/O of %s failed", self.name)
            self._shut_down()
            self._close_sockets()
            return False

    def _on_socket_events(self) -> bool:
        """Follow the DEALER's events (`zmq.EVENTS`, read last: the descriptor the I/O thread
        waits on signals only news) until it has none: whether replies are left to read."""
        while True:
            events = int(self._dealer.getsockopt(zmq.EVENTS))
            if self._connection.update(bool(events & zmq.POLLOUT)):
                if self._connection.up:
                    self._on_connected()
                else:
                    self._on_lost()
            elif not events & zmq.POLLIN:
                return False
            elif not self._reader.replies(_BURST, self._answered):
                return True

    def _answered(self, request_id: int) -> Pending[Any] | None:
        """The request that `request_id` answers, no longer pending (None if none is)."""
        self._sender.answered(request_id)
        with self._lock:
            return self._pending.pop(request_id, None)

    def _waiting(self, request_id: int) -> Pending[Any] | None:
        """The request `request_id`, if it still waits for its reply."""
        with self._lock:
            return self._pending.get(request_id)

    def _on_monitor_events(self, monitor: zmq.Socket[bytes]) -> None:
        refused = self._connection.refusal(monitor)
        if refused is None:
            return
        # ZeroMQ gives up on the connection: nothing pending will ever be sent.
        log.error("%s", refused)
        self._sender.refused()
        with self._lock:
            self._refused = refused
            pending, self._pending = list(self._pending.values()), {}
        for entry in pending:
            fail(entry.future, refused)

    def _on_connected(self) -> None:
        """A connection is up: send the requests held for one. Its security handshake passed,
        which the monitor was for: it goes (its two file descriptors with it)."""
        if self._monitor is not None:
            self._close_monitor(self._monitor)
        self._sender.send_held()
        self._data.reconnected()

    def _on_lost(self) -> None:
        """The connection is down: the requests it carried are lost, failed to be retried.
        Those not sent yet (submitted, or held for a connection) wait for the next one."""
        lost_ids = self._sender.lost()
        self._lose(lambda key, _: key in lost_ids, "")
        # Its data socket carries the replies of that connection only (a new one, even to the
        # same worker, is another client to it): a new one comes with the next connection.
        self._data.close("the connection it belongs to was lost")

    def _lose(self, lost: Callable[[int, Pending[Any]], bool], what: str) -> None:
        """Fail the requests pending that are `lost(id, entry)` with UNAVAILABLE, lost with
        the connection (its part `what`, if named), to be retried."""
        with self._lock:
            keys = [key for key, entry in self._pending.items() if lost(key, entry)]
            pending = [self._pending.pop(key) for key in keys]
        for key in keys:
            self._sender.answered(key)
        where = f"the connection to {self.name}{what}"
        if pending:
            log.warning("lost %s with %d requests", where, len(pending))
        for entry in pending:
            fail(entry.future, WorkerError("UNAVAILABLE", f"lost {where}"))

    def _fail_request(self, request_id: int, message: str) -> None:
        with self._lock:
            entry = self._pending.pop(request_id, None)
        if entry is not None:
            fail(entry.future, WorkerError("UNAVAILABLE", message))

    def _close_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        if self._watched:
            self._io.unwatch(monitor)
        self._dealer.disable_monitor()
        monitor.close(linger=0)
        self._monitor = None

    def _close_sockets(self) -> None:
        """Close the sockets and let go of the I/O thread, once closed (see `_shut_down`): no
        caller wakes it for this transport any more."""
        if self._monitor is not None:
            self._close_monitor(self._monitor)
        if self._watched:
            self._io.unwatch(self._dealer)
        self._dealer.close(linger=0)
        self._data.close("the transport closed")
        self._same_host.close()
        self._sockets_closed.set()
        zmq_io.SHARED.release(self._io)
