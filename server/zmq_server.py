"""The worker's ZeroMQ server: a ROUTER socket in front of the worker's request path.

It keeps sockets and framing (`loadax.wire.zmq_frames`): every request goes to its `RequestPath`,
and its `Ledger` holds it until libzmq is done with the reply. One I/O thread owns every socket it
polls; a thread pool handles requests and hands the replies back to it over an inproc PUSH/PULL
pair. A client's cancel lets go of its request at once when no handler has taken it yet, ends its
wait for a loading slot, or drops its reply once loaded. Optionally CURVE encrypts and authenticates
connections (with a ZAP allow-list of client keys), and a shared token must come with every request.

Memory: a request counts against its client's in-flight limit, and a batch keeps its share of
the memory budget, until libzmq is done with the reply (written to the socket, or dropped: its
client gone, which ROUTER_MANDATORY and heartbeats tell), as pyzmq's trackers say. A frame
larger than `MAX_REQUEST_BYTES` disconnects its peer before it is read, and a peer's complete
requests wait to be read `max_in_flight_per_client` at most. What stays unbounded: libzmq caps
frames, not messages, and holds a multipart message until its last frame has come, before the
server sees it or its token. A peer that can connect can make the worker hold one message of
many frames, each under the cap, per connection (256 frames of 4 MiB: about 1 GiB), until it is
complete and refused; the allocator may keep that memory afterwards. Only CURVE with an
allow-list keeps unknown peers from connecting at all.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import zmq
from zmq.auth.thread import ThreadAuthenticator

from loadax.errors import WorkerError
from loadax.logfields import fields
from loadax.server.admission import Transport
from loadax.server.config_security import CurveConfig
from loadax.server.handler_pool import HandlerPool
from loadax.server.ledger import Held, Ledger
from loadax.server.metrics import WorkerMetrics
from loadax.server.request_path import RequestPath
from loadax.server.throttled_log import ThrottledLog
from loadax.server.worker import Worker
from loadax.server.zmq_outbox import Outbox, tracked_frames
from loadax.validation import require_int
from loadax.wire import zmq_frames
from loadax.wire.credentials import BEARER
from loadax.wire.limits import (
    MAX_BATCH_BYTES,
    MAX_REQUEST_BYTES,
    ZMQ_HEARTBEAT_MS,
    ZMQ_HEARTBEAT_TIMEOUT_MS,
)

log = logging.getLogger(__name__)

_BURST = 256  # messages taken from one socket per poll, so neither direction starves the other
_MIN_FLUSH_S = 0.5  # how long replies sent last may take to leave at stop, grace or not
# How long the connections stay open at stop once the requests in flight are answered: a client
# drops the replies it has received but not read yet when its connection closes (IMMEDIATE), so
# it is given time to read them; new requests are still refused meanwhile.
_FAREWELL_S = 0.25
_REPLIES = "inproc://loadax-zmq-replies"
_REAP_MS = 1  # how often the I/O thread looks for replies libzmq is done with, while any are out
_SETTLE_S = 0.02  # how long a request over its client's limit waits for the client's oldest reply
# Requests handled at once, each on a thread of its own (idle ones leave), so that batch requests
# wait their turn for a loading slot (fairly between clients) rather than in arrival order; as
# many as a gRPC worker's calls by default. More wait for a thread in arrival order.
_HANDLERS = 128
_TRANSPORT = Transport(
    "zmq",
    send_token="send a 4th request frame, 'Bearer <token>'",
    counted="requests",
    max_reply_bytes=MAX_BATCH_BYTES,
)


class ZmqServer:
    """Serves `worker` on a ROUTER socket bound to `endpoint` ("tcp://host:port", port 0: any).

    `threads` batches load at once, shared fairly between the clients waiting. At most
    `max_in_flight_per_client` requests of one client (a peer, and the id its requests name: see
    `RequestPath.arrive`) are in flight, each until its reply has left; more are refused with
    RESOURCE_EXHAUSTED. A peer that sends a frame larger than
    `max_request_bytes` is disconnected by ZeroMQ. A batch of more than `max_reply_bytes` (what a
    client takes by default) is refused with INVALID_ARGUMENT, before it is built when its size
    is known.

    With `curve` the socket is a CURVE server: only clients that know its public key (and, with
    an allow-list, whose key is on it) connect. With `token`, requests without it get
    UNAUTHENTICATED. Every request is counted in `metrics` (by default, metrics of its own).
    """

    def __init__(
        self,
        worker: Worker,
        endpoint: str,
        *,
        threads: int = 8,
        max_in_flight_per_client: int = 64,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_reply_bytes: int = MAX_BATCH_BYTES,
        curve: CurveConfig | None = None,
        token: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        require_int("max_reply_bytes", max_reply_bytes, minimum=1)
        self._requests = RequestPath(
            worker,
            dataclasses.replace(_TRANSPORT, max_reply_bytes=max_reply_bytes),
            threads=threads,
            max_in_flight_per_client=max_in_flight_per_client,
            token=token,
            metrics=metrics,
        )
        require_int("max_request_bytes", max_request_bytes, minimum=1)
        self._endpoint = endpoint.replace("zmq://", "tcp://", 1)
        self._max_in_flight = max_in_flight_per_client
        self._max_request_bytes = max_request_bytes
        self._curve = curve
        self._warnings = ThrottledLog(log)
        self._authenticator: ThreadAuthenticator | None = None
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()  # a second stop() waits for the first
        self._grace = 0.0
        self._started = False
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._thread: threading.Thread | None = None
        # Its threads start with the first requests.
        self._pool = HandlerPool(max(threads, _HANDLERS), "loadax-zmq-handler")
        # Handler threads share one PUSH socket; the lock is what makes that safe.
        self._push_lock = threading.Lock()
        self._push: zmq.Socket[bytes] | None = None
        self._outbox = Outbox(self._requests.ledger)
        # The requests admitted and not answered yet, by routing identity and request id, that
        # a cancel may find; the I/O thread adds them, the handlers and cancels take them.
        self._admitted_lock = threading.Lock()
        self._admitted: dict[tuple[bytes, int], _Admitted] = {}

    @property
    def ledger(self) -> Ledger:
        """What the server holds for its clients until libzmq is done with their replies."""
        return self._requests.ledger

    def start(self) -> str:
        """Bind and start serving; returns the bound endpoint, e.g. "tcp://127.0.0.1:40123"."""
        if self._started:
            raise RuntimeError("a ZeroMQ server starts once")
        self._started = True
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        # Fail sends to peers that are gone instead of dropping them silently, and never block.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A larger frame disconnects its peer before it is read (see the module docstring).
        router.setsockopt(zmq.MAXMSGSIZE, self._max_request_bytes)
        # Requests of a peer waiting to be read: a well-behaved client has at most its in-flight
        # limit out, and the I/O thread takes them as they come.
        router.setsockopt(zmq.RCVHWM, self._max_in_flight)
        # Replies waiting for a peer: its admitted ones (at most its limit) and refusals.
        router.setsockopt(zmq.SNDHWM, 2 * self._max_in_flight + 64)
        # Frees what a client that vanished without closing its connection holds.
        router.setsockopt(zmq.HEARTBEAT_IVL, ZMQ_HEARTBEAT_MS)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMQ_HEARTBEAT_TIMEOUT_MS)
        if self._curve is not None:
            self._secure(context, router, self._curve)
        try:
            router.bind(self._endpoint)
        except zmq.ZMQError as error:
            router.close(linger=0)
            self._stop_authenticator()
            context.term()
            raise OSError(f"cannot bind the ZeroMQ server to {self._endpoint}: {error}") from error
        endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        replies = context.socket(zmq.PULL)
        # Replies are bounded by the requests admitted, so the inproc pipe needs no limit.
        replies.setsockopt(zmq.RCVHWM, 0)
        replies.bind(_REPLIES)
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(_REPLIES)
        self._context, self._push = context, push
        self._thread = threading.Thread(
            target=self._serve, args=(router, replies), name="loadax-zmq-server", daemon=True
        )
        self._thread.start()
        log.info(
            "serving ZeroMQ on %s",
            endpoint,
            extra=fields(event="listening", worker=endpoint.replace("tcp://", "zmq://", 1)),
        )
        return endpoint

    def _secure(
        self, context: zmq.Context[zmq.Socket[bytes]], router: zmq.Socket[bytes], curve: CurveConfig
    ) -> None:
        """Make `router` a CURVE server; with an allow-list, start the ZAP handler that checks
        client keys (before binding, so that no client connects unchecked)."""
        router.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
        router.setsockopt(zmq.CURVE_PUBLICKEY, curve.public_key)
        router.setsockopt(zmq.CURVE_SERVER, 1)
        if curve.allowed_clients is None:
            return
        self._authenticator = ThreadAuthenticator(context, log=log.getChild("zap"))
        self._authenticator.start()
        self._authenticator.configure_curve_callback("*", _AllowList(curve.allowed_clients))

    def _stop_authenticator(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None

    def stop(self, grace: float) -> None:
        """Refuse new requests, and those waiting to load, with UNAVAILABLE, let those loading
        finish for up to `grace` seconds and send their replies, then close the sockets.

        The connections stay open a quarter of a second more, for clients to read the last
        replies, which still queued get at least half a second to leave. Handlers still running
        after `grace` are not awaited; their replies are dropped.
        """
        with self._stop_lock:
            if self._thread is None or self._context is None:
                return
            self._grace = max(0.0, grace)
            self._stopping.set()
            self._requests.stop()
            self._wake()
            self._thread.join()
            with self._push_lock:
                if self._push is not None:
                    self._push.close(linger=0)
                    self._push = None
            # Past the grace, handlers may still run: their replies are dropped, not awaited.
            self._pool.shutdown(wait=self.ledger.in_flight == 0, cancel_futures=True)
            self._stop_authenticator()
            self._context.term()
            self._outbox.release_all()  # libzmq has let go of every reply now
            self._thread = self._context = None

    def _wake(self) -> None:
        with self._push_lock:
            if self._push is not None:
                self._push.send(b"")

    def _serve(self, router: zmq.Socket[bytes], replies: zmq.Socket[bytes]) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(replies, zmq.POLLIN)
        deadline: float | None = None
        closing: float | None = None  # when the connections close, once stopping
        try:
            while True:
                now = time.monotonic()
                if deadline is None and self._stopping.is_set():
                    deadline = now + self._grace
                if (
                    closing is None
                    and deadline is not None
                    and (self.ledger.in_flight == 0 or now >= deadline)
                ):
                    closing = now + _FAREWELL_S
                if closing is not None and now >= closing:
                    # Answer what is already queued UNAVAILABLE, so that clients retry elsewhere.
                    self._receive_requests(router)
                    break
                wake_at = closing if closing is not None else deadline
                timeout_ms = None
                if wake_at is not None:
                    timeout_ms = max(math.ceil(1000 * (wake_at - now)), 0)
                if self._outbox.pending:
                    timeout_ms = min(timeout_ms, _REAP_MS) if timeout_ms is not None else _REAP_MS
                ready = dict(poller.poll(timeout_ms))
                self._outbox.reap()
                if replies in ready:
                    self._forward_replies(replies, router)
                if router in ready:
                    self._receive_requests(router)
        except Exception:
            log.exception("the ZeroMQ server's I/O thread failed; it stops serving")
        finally:
            remaining = 0.0 if deadline is None else deadline - time.monotonic()
            router.close(linger=int(1000 * max(remaining, _MIN_FLUSH_S)))
            replies.close(linger=0)
            # No client is served any more: what their replies hold is no longer theirs.
            self._outbox.release_all()

    def _receive_requests(self, router: zmq.Socket[bytes]) -> None:
        for _ in range(_BURST):
            try:
                message = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._admit(router, message)
            except Exception:
                # Whatever a client sends, the server keeps serving the others.
                log.exception("failed to handle a message from a ZeroMQ client")

    def _admit(self, router: zmq.Socket[bytes], message: list[zmq.Frame]) -> None:
        identity = message[0].bytes
        frames = [frame.buffer for frame in message[1:]]
        try:
            request_id = zmq_frames.parse_request_id(frames[0]) if frames else None
        except WorkerError:
            request_id = None
        if request_id is None:
            self._warnings.warning(
                (identity, "no request id"),
                "dropped a message of %d frames from %s: no request id to answer",
                len(frames),
                _client(identity),
            )
            return
        client = _client(identity)
        try:
            # The token first: a request without the right one is refused unparsed.
            token = zmq_frames.request_token(frames)
            self._requests.admission.authenticate([] if token is None else [BEARER + token])
            cancelled = zmq_frames.parse_cancel(frames)
            if cancelled is not None:
                self._cancel((identity, cancelled))
                return
            request = zmq_frames.parse_request(frames)
            if self._stopping.is_set():
                raise WorkerError("UNAVAILABLE", "the worker is shutting down")
        except WorkerError as error:
            # The method frame as sent: the metrics count unknown ones as such.
            method = bytes(frames[1][:64]).decode("ascii", "replace") if len(frames) > 1 else ""
            self._requests.admission.refuse(method, client, error)
            self._send(router, [identity, *zmq_frames.error_frames(request_id, error)])
            return
        held = self._requests.arrive(identity, client, request.message)
        # A client at its limit is refused only once its oldest reply has had a moment to be
        # let go of (`Outbox.settle`).
        refusal = self._requests.admit(
            request.message, held, settle=lambda: self._outbox.settle(held.client, _SETTLE_S)
        )
        if refusal is not None:
            self.ledger.done(held)
            self._send(router, [identity, *zmq_frames.error_frames(request_id, refusal)])
            return
        key = (identity, request_id)
        admitted = _Admitted(held)
        with self._admitted_lock:
            self._admitted[key] = admitted
        admitted.task = self._pool.submit(self._handle, key, admitted, request)

    def _cancel(self, key: tuple[bytes, int]) -> None:
        """The client of routing identity and request id `key` no longer waits for its reply:
        a request not handled yet is let go of at once, one waiting for a loading slot gives
        up its wait, and the reply of one loading is dropped (`_handle`). A request answered
        already, or never admitted, is left alone."""
        with self._admitted_lock:
            admitted = self._admitted.get(key)
            if admitted is None:
                return
            admitted.cancelled = True
            # The handler cannot start once its task is cancelled, nor pass `_admitted` before.
            unstarted = admitted.task is not None and admitted.task.cancel()
            if unstarted:
                del self._admitted[key]
        if unstarted:
            self.ledger.done(admitted.held)
        else:
            self._requests.recheck()

    def _handle(
        self, key: tuple[bytes, int], admitted: _Admitted, request: zmq_frames.Request
    ) -> None:
        """Runs on a handler thread: the worker's answer goes back to the I/O thread, unless
        the client cancelled the request meanwhile. The request stays held, and a batch keeps
        its share of the memory budget, until libzmq is done with the reply (sent, or dropped),
        or until it is answered, when cancelled."""
        identity, request_id = key
        held = admitted.held
        answer = self._requests.answer(request.message, held, lambda: not admitted.cancelled)
        with self._admitted_lock:
            if self._admitted.get(key) is admitted:
                del self._admitted[key]
            cancelled = admitted.cancelled
        if cancelled:
            self.ledger.done(held)
            log.debug("dropped the reply to request %d of %s: cancelled", request_id, held.name)
            return
        if isinstance(answer, WorkerError):
            self._push_reply(
                identity, held, request_id, zmq_frames.error_frames(request_id, answer)
            )
        else:
            self._push_reply(
                identity, held, request_id, zmq_frames.reply_frames(request_id, answer)
            )

    def _push_reply(
        self, identity: bytes, held: Held, request_id: int, reply: list[zmq_frames.Buffer]
    ) -> None:
        """Hand `reply` to the I/O thread. Its tracked frames are referred to from this call's
        frame only: the tracker is done once libzmq has sent them and they are freed, and an
        error answered holds the frames its traceback passed through (`_handle`'s among them)
        in a reference cycle until the garbage collector runs, with the client's slot."""
        frames, tracker = tracked_frames(reply)
        with self._push_lock:
            if self._push is None:
                self.ledger.done(held)
                log.warning("dropped the reply to request %d: the server stopped", request_id)
                return
            # Watched before it is sent, so that the I/O thread, which forwards it, looks for
            # it until libzmq is done with it.
            self._outbox.add(held, tracker)
            try:
                self._push.send_multipart([identity, *frames], copy=False)
            except zmq.ZMQError:
                self.ledger.done(held)
                log.exception("dropped the reply to request %d", request_id)

    def _forward_replies(self, replies: zmq.Socket[bytes], router: zmq.Socket[bytes]) -> None:
        for _ in range(_BURST):
            try:
                message = replies.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(message) == 1:
                continue  # stop()'s wake-up
            self._send(router, message)

    def _send(
        self, router: zmq.Socket[bytes], message: Sequence[zmq.Frame | bytes | memoryview]
    ) -> None:
        try:
            router.send_multipart(message, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            peer = _peer(message)
            self._warnings.warning(
                (peer, "not reading"), "dropped a reply to %s: it is not reading", peer
            )
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:
                raise
            log.debug("dropped a reply to %s: it disconnected", _peer(message))


@dataclasses.dataclass(eq=False, slots=True)
class _Admitted:
    """A request admitted and not answered yet: its entry in the ledger, its handler's task,
    and whether its client cancelled it."""

    held: Held
    task: Future[None] | None = None
    cancelled: bool = False


class _AllowList:
    """The ZAP authenticator's CURVE callback: admits the listed client public keys (Z85)."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self._keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self._keys:
            return True
        log.warning("refused a ZeroMQ client: its CURVE key %s is not allowed", key.decode())
        return False


def _peer(message: Sequence[zmq.Frame | bytes | memoryview]) -> str:
    identity = message[0]
    return _client(identity.bytes if isinstance(identity, zmq.Frame) else bytes(identity))


def _client(identity: bytes) -> str:
    """How the logs name a client: by its routing identity."""
    return f"client {identity.hex()}"
