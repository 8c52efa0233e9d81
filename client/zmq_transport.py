"""The client side of the ZeroMQ transport: `ZmqTarget`, a DEALER socket to one worker.

Framing is `loadax.wire.zmq_frames`. One I/O thread owns the DEALER socket; callers hand it
requests through a queue and wake it over an inproc PUSH/PULL pair. It receives a batch's
payload frames into one buffer of a `BufferPool`, reused once the batch decoded from it is gone.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

import zmq
from zmq.utils.monitor import parse_monitor_message

from loadax.buffers import BufferPool
from loadax.client.replies import ReplyDecoder
from loadax.client.security import ClientSecurity
from loadax.errors import RecordError, WorkerError
from loadax.wire import zmq_frames
from loadax.wire.failures import BAD_REPLY
from loadax.wire.limits import (
    DEFAULT_TIMEOUT_S,
    MAX_BATCH_BYTES,
    ZMQ_HEARTBEAT_MS,
    ZMQ_HEARTBEAT_TIMEOUT_MS,
)
from loadax.wire.messages import RequestMessage, method_of
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)

_BURST = 256  # replies taken per poll, so that submissions are not starved
# Requests waiting for a connection are sent when its handshake succeeds; this is a fallback
# should a send still find no connection then.
_HELD_RETRY_MS = 100
_SILENT_REFUSALS = 3  # handshakes failed without a reason that make a refusal (without CURVE)
_WAKE = "inproc://loadax-zmq-wake"
_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

T = TypeVar("T")
Frames = Sequence[bytes | memoryview]


@dataclasses.dataclass(frozen=True, slots=True)
class _Pending(Generic[T]):
    future: Future[T]
    # The reply's frames -> the result; raises WorkerError (or RecordError for a failed record).
    complete: Callable[[Frames], T]
    # Whether the request waits for a connection rather than failing at once without one.
    patient: bool
    # Whether the reply is a batch, whose payload is received into a pooled buffer.
    batch: bool = False


class ZmqTarget:
    """A worker reached over ZeroMQ at "zmq://host:port" (or "tcp://host:port").

    Requests are multiplexed on one connection and matched to replies by request id; ZeroMQ
    reconnects by itself. A worker that is gone, frozen or stopping fails requests at once:
    without a connection (ZeroMQ's IMMEDIATE) a batch request fails with UNAVAILABLE, and one
    lost with its connection, closed by the worker or by missed heartbeats (within
    `ZMQ_HEARTBEAT_TIMEOUT_MS`), fails too. A handshake or an info request waits for a
    connection up to its timeout instead, and so does every request until the first connection.

    With `security.curve_server_key` the connection is CURVE-encrypted, and `security.token`
    goes with every request. A worker that refuses the security handshake (a CURVE key it does
    not allow, or CURVE on one side only) fails every request with UNAUTHENTICATED, for good:
    ZeroMQ does not retry such a connection.

    A batch's payload is received into a buffer of `buffers` (by default a pool of its own),
    and a reply whose payload is larger than `max_reply_bytes` (by default `MAX_BATCH_BYTES`) is
    refused before anything is allocated for it.
    """

    def __init__(
        self,
        address: str,
        security: ClientSecurity | None = None,
        *,
        max_reply_bytes: int | None = None,
        buffers: BufferPool | None = None,
    ) -> None:
        self.name = address
        self._replies = ReplyDecoder(address)
        self._buffers = buffers or BufferPool()
        self._max_payload = MAX_BATCH_BYTES if max_reply_bytes is None else max_reply_bytes
        endpoint = _endpoint(address)
        security = security or ClientSecurity()
        self._token = security.token
        self._curve = security.curve_server_key is not None
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._dealer = self._context.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        if security.curve_server_key is not None:
            public, secret = security.curve_client_keypair or tuple(
                key.decode("ascii") for key in zmq.curve_keypair()
            )
            self._dealer.setsockopt(zmq.CURVE_SERVERKEY, security.curve_server_key.encode())
            self._dealer.setsockopt(zmq.CURVE_PUBLICKEY, public.encode())
            self._dealer.setsockopt(zmq.CURVE_SECRETKEY, secret.encode())
        # Replies are bounded by the requests in flight; refusing them would only lose them.
        self._dealer.setsockopt(zmq.RCVHWM, 0)
        if max_reply_bytes is not None:
            self._dealer.setsockopt(zmq.MAXMSGSIZE, max_reply_bytes)
        # A worker that dies without closing its connection is found by missing heartbeats;
        # the worker's ZeroMQ I/O thread answers them however busy its handlers are.
        self._dealer.setsockopt(zmq.HEARTBEAT_IVL, ZMQ_HEARTBEAT_MS)
        self._dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMQ_HEARTBEAT_TIMEOUT_MS)
        # Without a connection a send fails instead of queueing for a peer that may never come
        # back: a batch request goes to another worker at once. (The price: replies received
        # and not yet read when a connection closes are dropped; a stopping worker waits a
        # moment before it closes, for them to be read.)
        self._dealer.setsockopt(zmq.IMMEDIATE, 1)
        # A lost connection loses the requests it carried: they are failed, to be retried.
        # A refused security handshake fails them for good.
        self._monitor = self._dealer.get_monitor_socket(_EVENTS)
        self._wake_in = self._context.socket(zmq.PULL)
        self._wake_in.setsockopt(zmq.LINGER, 0)
        self._wake_in.setsockopt(zmq.RCVHWM, 0)
        self._wake_in.bind(_WAKE)
        self._wake_out = self._context.socket(zmq.PUSH)
        self._wake_out.setsockopt(zmq.LINGER, 0)
        self._wake_out.setsockopt(zmq.SNDHWM, 0)
        self._wake_out.connect(_WAKE)
        # `_lock` guards `_pending`, `_closed`, `_refused` and `_wake_out`, which any thread uses.
        self._lock = threading.Lock()
        try:
            self._dealer.connect(endpoint)
        except zmq.ZMQError as error:
            self._close_sockets()
            raise ValueError(f"invalid ZeroMQ address {address!r}: {error}") from None
        self._pending: dict[int, _Pending[Any]] = {}
        self._closed = False
        self._refused: WorkerError | None = None
        # Owned by the I/O thread: whether the current connection finished its handshake, and
        # whether any did; the requests sent and not answered yet (cancelled ones too: the
        # worker still answers them); patient requests that found no connection, in order.
        self._handshaked = False
        self._connected_once = False
        self._sent: set[int] = set()
        self._held: collections.deque[tuple[int, list[bytes]]] = collections.deque()
        # Connections whose handshake failed without a reason (e.g. a wrong CURVE server key).
        self._handshake_failures = 0
        self._outbox: queue.SimpleQueue[tuple[int, list[bytes]] | None] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._serve, name="loadax-zmq-client", daemon=True)
        self._thread.start()

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        return self._replies.learn(self._call(request, _response(wire.HandshakeResponse), timeout))

    def info(
        self, request: wire.InfoRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.InfoResponse:
        return self._call(request, _response(wire.InfoResponse), timeout)

    def load_batch(self, request: wire.BatchRequest) -> Future[Any]:
        """A future of the decoded batch; its arrays are read-only views of the buffer its
        payload was received into, which is not reused while any of them (or anything made
        from them without a copy) is alive.

        Its exception is a `WorkerError`: the worker's, DATA_LOSS for a reply that fails its
        checks, or UNAVAILABLE without a connection to the worker (once there was one), with one
        lost, or once the target is closed; or a `RecordError` for a failed record.
        """
        return self._submit(
            request, lambda frames: self._batch(request, frames), patient=False, batch=True
        )

    def close(self) -> None:
        """Fail pending requests with UNAVAILABLE and stop the I/O thread."""
        self._shut_down()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> ZmqTarget:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _batch(self, request: wire.BatchRequest, frames: Frames) -> Any:
        """The verified batch in the reply `frames` to `request` (on the I/O thread)."""
        try:
            reply = zmq_frames.parse_batch_reply(frames)
        except WorkerError as error:
            failure = self._replies.failure(error)
            raise failure from failure.__cause__  # a RecordError keeps its cause
        return self._replies.decode(request, reply.header, reply.payload)

    def _call(self, request: RequestMessage, complete: Callable[[Frames], T], timeout: float) -> T:
        """The reply to `request`, waiting up to `timeout` for a connection and the answer."""
        future = self._submit(request, complete, patient=True)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            message = f"{self.name} did not answer {method_of(request)} within {timeout} s"
            if self._handshake_failures:
                message += (
                    f"; {self._handshake_failures} connections failed their security handshake: "
                    + (
                        "is curve_server_key the worker's public key?"
                        if self._curve
                        else "does the worker require CURVE (ClientSecurity.curve_server_key)?"
                    )
                )
            raise WorkerError("DEADLINE_EXCEEDED", message) from None

    def _submit(
        self,
        request: RequestMessage,
        complete: Callable[[Frames], T],
        *,
        patient: bool,
        batch: bool = False,
    ) -> Future[T]:
        future: Future[T] = Future()
        request_id = next(self._ids)
        frames = zmq_frames.request_frames(request_id, request, self._token)
        with self._lock:
            if self._closed:
                future.set_exception(WorkerError("UNAVAILABLE", f"{self.name} is closed"))
                return future
            if self._refused is not None:
                future.set_exception(self._refused)
                return future
            self._pending[request_id] = _Pending(future, complete, patient, batch)
            self._outbox.put((request_id, frames))
            self._wake_out.send(b"")

        def forget(done: Future[T]) -> None:
            if done.cancelled():
                with self._lock:
                    self._pending.pop(request_id, None)

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
            self._wake_out.send(b"")
        for entry in pending:
            _fail(entry.future, WorkerError("UNAVAILABLE", f"{self.name} was closed"))

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll(_HELD_RETRY_MS if self._held else None))
                if self._wake_in in ready and not self._send_submitted():
                    return
                if self._dealer in ready:
                    self._receive_replies()
                if self._monitor in ready:
                    self._on_monitor_events()
                if self._held:
                    self._send_held()
        except Exception:
            log.exception("the ZeroMQ I/O thread of %s failed", self.name)
        finally:
            self._shut_down()
            self._close_sockets()

    def _send_submitted(self) -> bool:
        """Send what callers submitted; False once close() asked the thread to stop."""
        while True:
            try:
                self._wake_in.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        # Every submission is queued before its wake-up is sent, so none is missed here.
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            request_id, frames = item
            if self._held:  # no connection yet: behind those waiting for one, or failed
                self._unsent(request_id, frames)
                continue
            try:
                self._dealer.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                # With IMMEDIATE a DEALER refuses to queue when it has no connection (none yet,
                # one just dropped, or a peer frozen mid-handshake) or its queue is full.
                self._unsent(request_id, frames)
            else:
                self._sent.add(request_id)

    def _unsent(self, request_id: int, frames: list[bytes]) -> None:
        """A request that found no connection: held until there is one if it is patient (and
        before the first connection, which a refused security handshake never makes, so that
        its event says why), else failed with UNAVAILABLE, to be sent to another worker."""
        with self._lock:
            entry = self._pending.get(request_id)
        if entry is None:
            return  # cancelled, or failed already
        if entry.patient or not self._connected_once:
            self._held.append((request_id, frames))
            return
        self._fail_request(
            request_id, f"{self.name} is not reachable: no connection, or too many requests queued"
        )

    def _send_held(self) -> None:
        """Send the requests waiting for a connection, in order, while one takes them."""
        while self._held:
            request_id, frames = self._held[0]
            with self._lock:
                waiting = request_id in self._pending
            if waiting:
                try:
                    self._dealer.send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    return
                self._sent.add(request_id)
            self._held.popleft()

    def _receive_replies(self) -> None:
        for _ in range(_BURST):
            try:
                first = self._dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            # The rest of a message is there as soon as its first frame is (ZeroMQ delivers
            # whole messages), and must be read before the next message, whatever happens.
            try:
                request_id = zmq_frames.parse_request_id(first)
            except WorkerError as error:
                self._discard_rest()
                log.debug("dropped a reply from %s: %s", self.name, error)
                continue
            self._sent.discard(request_id)
            with self._lock:
                entry = self._pending.pop(request_id, None)
            if entry is None:
                self._discard_rest()
                log.debug("dropped a reply from %s to unknown request %d", self.name, request_id)
                continue
            try:
                result = entry.complete([first, *self._receive_rest(entry.batch)])
            except (WorkerError, RecordError) as error:
                _fail(entry.future, error)
            except Exception as error:
                _fail(entry.future, WorkerError(BAD_REPLY, f"bad reply from {self.name}: {error}"))
            else:
                if entry.future.set_running_or_notify_cancel():
                    entry.future.set_result(result)

    def _receive_rest(self, batch: bool) -> list[bytes | memoryview]:
        """The frames of a reply after its request id. Those of a successful `batch` reply after
        its header (the payload) come as one frame: the buffer of the pool they were received
        into, one after the other."""
        frames: list[bytes | memoryview] = []
        while self._dealer.getsockopt(zmq.RCVMORE):
            if batch and len(frames) == 2 and frames[0] == zmq_frames.OK:
                frames.append(self._receive_payload(frames[1]))
                break
            frames.append(self._dealer.recv())
        return frames

    def _receive_payload(self, head: bytes | memoryview) -> memoryview:
        """The rest of a batch reply (its payload frames) received into one pooled buffer of the
        size its header `head` declares. More bytes than that would be cut short by ZeroMQ (it
        tells how long a frame was): a BAD_REPLY naming both sizes, never a truncated batch."""
        try:
            size = zmq_frames.batch_payload_size(head, self._max_payload)
        except WorkerError:
            self._discard_rest()
            raise
        buffer = self._buffers.take(size)
        received = 0
        while True:
            length = self._dealer.recv_into(buffer[received:])
            if length > size - received:
                self._discard_rest()
                raise WorkerError(
                    BAD_REPLY,
                    f"{self.name} sent a batch reply whose payload frames hold more than the "
                    f"{size} bytes its header declares: a frame of {length} bytes came with "
                    f"{size - received} left",
                )
            received += length
            if not self._dealer.getsockopt(zmq.RCVMORE):
                return buffer[:received]

    def _discard_rest(self) -> None:
        """Read the frames left of the message being received, keeping none."""
        while self._dealer.getsockopt(zmq.RCVMORE):
            self._dealer.recv_into(bytearray())

    def _on_monitor_events(self) -> None:
        refused: WorkerError | None = None
        lost = False
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshaked = self._connected_once = True
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                refused = WorkerError(
                    "UNAUTHENTICATED",
                    f"{self.name} refused this client's CURVE key (ZAP status {value}): it is "
                    "not on the worker's allowed_clients",
                )
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                refused = WorkerError("UNAUTHENTICATED", self._protocol_failure(value))
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self._handshake_failures += 1
                # Without CURVE a handshake fails only against a worker that requires it; when
                # the worker closes first, libzmq says so without the reason. A few in a row,
                # none ever succeeding, are that refusal (a worker dying mid-handshake is not).
                if (
                    not self._curve
                    and not self._connected_once
                    and self._handshake_failures >= _SILENT_REFUSALS
                ):
                    refused = WorkerError(
                        "UNAUTHENTICATED",
                        f"{self.name} closed {self._handshake_failures} security handshakes "
                        "without saying why: it most likely requires CURVE: set "
                        "ClientSecurity.curve_server_key to the worker's public key",
                    )
            elif kind == zmq.EVENT_DISCONNECTED:
                # Requests leave only once a handshake is done (IMMEDIATE): a connection lost
                # before that carried none of them.
                lost = lost or self._handshaked
                self._handshaked = False
        if refused is not None:
            # ZeroMQ gives up on the connection: nothing pending will ever be sent.
            log.error("%s", refused)
            self._held.clear()
            self._sent.clear()
            with self._lock:
                self._refused = refused
                pending, self._pending = list(self._pending.values()), {}
            for entry in pending:
                _fail(entry.future, refused)
            return
        if not lost:
            return
        # Requests not sent yet (submitted, or held for a connection) wait for the next one.
        lost_ids, self._sent = self._sent, set()
        with self._lock:
            pending = [self._pending.pop(key) for key in lost_ids if key in self._pending]
        if pending:
            log.warning("lost the connection to %s with %d requests", self.name, len(pending))
        for entry in pending:
            _fail(entry.future, WorkerError("UNAVAILABLE", f"lost the connection to {self.name}"))

    def _protocol_failure(self, code: int) -> str:
        if code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            if self._curve:
                return (
                    f"{self.name} does not use CURVE, but this client does (curve_server_key "
                    "is set): the security handshake failed"
                )
            return (
                f"{self.name} requires CURVE: set ClientSecurity.curve_server_key to the "
                "worker's public key"
            )
        return f"the security handshake with {self.name} failed: ZeroMQ protocol error {code:#x}"

    def _fail_request(self, request_id: int, message: str) -> None:
        with self._lock:
            entry = self._pending.pop(request_id, None)
        if entry is not None:
            _fail(entry.future, WorkerError("UNAVAILABLE", message))

    def _close_sockets(self) -> None:
        # The lock orders this after any caller's last use of the wake-up socket.
        with self._lock:
            self._wake_out.close(linger=0)
        self._wake_in.close(linger=0)
        self._dealer.disable_monitor()
        self._monitor.close(linger=0)
        self._dealer.close(linger=0)
        self._context.term()


def _response(kind: type[zmq_frames.R]) -> Callable[[Frames], zmq_frames.R]:
    return lambda frames: zmq_frames.parse_reply(frames, kind).response


def _fail(future: Future[Any], error: Exception) -> None:
    # A cancelled future has nobody waiting for it.
    if future.set_running_or_notify_cancel():
        future.set_exception(error)


def _endpoint(address: str) -> str:
    for scheme in ("zmq://", "tcp://"):
        if address.startswith(scheme):
            return "tcp://" + address.removeprefix(scheme)
    raise ValueError(f"a ZeroMQ address is zmq://host:port or tcp://host:port, got {address!r}")
