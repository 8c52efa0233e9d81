"""The worker's ZeroMQ server: a ROUTER socket in front of the worker's request path.

It keeps sockets and framing (`loadax.wire.zmq_frames`): every request goes to its `RequestPath`
(through `loadax.server.zmq_service`, which handles it on a thread of its own), and its `Ledger`
holds it until libzmq is done with the reply. One I/O thread owns every socket it polls. Optionally
CURVE encrypts and authenticates connections (with a ZAP allow-list of client keys), and a shared
token must come with every request. Without CURVE, a data port beside the ROUTER socket carries
batch replies to the clients that ask for it at their handshake (`loadax.server.zmq_data`).

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

import zmq
from zmq.auth.thread import ThreadAuthenticator

from loadax.logfields import fields
from loadax.server.admission import Transport
from loadax.server.config_security import CurveConfig
from loadax.server.ledger import Ledger
from loadax.server.metrics import WorkerMetrics
from loadax.server.request_path import RequestPath
from loadax.server.throttled_log import ThrottledLog
from loadax.server.worker import Worker
from loadax.server.zmq_data import DataPort
from loadax.server.zmq_outbox import Outbox
from loadax.server.zmq_service import ZmqService, client_name
from loadax.validation import require_int
from loadax.wire import zmq_data, zmq_frames
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
_REAP_MS = 1  # how often the I/O thread looks for replies libzmq is done with, while any are out
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

    On `data_port` (0: any free port; None: none), on the endpoint's host, clients that ask for
    it at their handshake open a data socket that their successful batch replies come on
    (`loadax.wire.zmq_data`), each held in the ledger until written to it; never with `curve`,
    whose protection covers what ZeroMQ carries only: its payloads stay inside.
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
        data_port: int | None = 0,
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
        self._outbox = Outbox(self._requests.ledger)
        # CURVE protects what ZeroMQ carries, not a plain socket: its payloads stay inside.
        self._data: DataPort | None = None
        if data_port is not None and curve is None:
            require_int("data_port", data_port, minimum=0)
            max_message = max_request_bytes + zmq_data.MESSAGE_OVERHEAD
            self._data = DataPort(_bound_host(self._endpoint), data_port, max_message)
        self._service = ZmqService(
            self._requests, self._outbox, threads, self._stopping, self._data
        )

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
        if self._data is not None:
            try:
                self._data.open()
            except OSError:
                router.close(linger=0)
                self._stop_authenticator()
                context.term()
                raise
        endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        replies = self._service.open(context)
        self._context = context
        self._thread = threading.Thread(
            target=self._serve, args=(router, replies), name="loadax-zmq-server", daemon=True
        )
        self._thread.start()
        log.info(
            "serving ZeroMQ on %s%s",
            endpoint,
            "" if self._data is None else f", batch replies on data port {self._data.port}",
            extra=fields(event="listening", worker=endpoint.replace("tcp://", "zmq://", 1)),
        )
        return endpoint

    @property
    def data_port(self) -> int | None:
        """The data port once started (`loadax.wire.zmq_data`); None: batch replies go over
        ZeroMQ only (turned off, or CURVE)."""
        return None if self._data is None else self._data.port

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
            self._service.wake()
            self._thread.join()
            # Past the grace, handlers may still run: their replies are dropped, not awaited.
            self._service.close()
            self._stop_authenticator()
            self._context.term()
            self._outbox.release_all()  # libzmq has let go of every reply now
            self._thread = self._context = None

    def _serve(self, router: zmq.Socket[bytes], replies: zmq.Socket[bytes]) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(replies, zmq.POLLIN)
        if self._data is not None:
            self._data.attach(poller)
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
                greeting_ms = None if self._data is None else self._data.timeout_ms(now)
                if greeting_ms is not None:
                    timeout_ms = greeting_ms if timeout_ms is None else min(timeout_ms, greeting_ms)
                ready = dict(poller.poll(timeout_ms))
                self._outbox.reap()
                if self._data is not None:
                    self._data.serve(
                        ready,
                        time.monotonic(),
                        lambda identity, frames: self._take(router, identity, frames, True),
                    )
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
            if self._data is not None:
                self._data.close()
            # No client is served any more: what their replies hold is no longer theirs.
            self._outbox.release_all()

    def _receive_requests(self, router: zmq.Socket[bytes]) -> None:
        for _ in range(_BURST):
            try:
                message = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._take(router, message[0].bytes, [frame.buffer for frame in message[1:]])

    def _take(
        self,
        router: zmq.Socket[bytes],
        identity: bytes,
        frames: Sequence[zmq_frames.Buffer],
        data_socket: bool = False,
    ) -> None:
        """Hand the `frames` of a message from the connection of routing `identity` (on its
        `data_socket`, or the ROUTER socket) to the service, answering its refusal, if any."""
        try:
            refusal = self._service.take(identity, frames, data_socket)
            if refusal is not None:
                self._send(router, refusal)
        except Exception:
            # Whatever a client sends, the server keeps serving the others.
            log.exception("failed to handle a message from a ZeroMQ client")

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


def _bound_host(endpoint: str) -> str:
    """The host of `endpoint` ("tcp://host:port") as a plain socket binds it ("" for "*")."""
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    return "" if host == "*" else host


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
    return client_name(identity.bytes if isinstance(identity, zmq.Frame) else bytes(identity))
