"""The worker over gRPC: the `loadax.wire.v1.Worker` service, health checks and reflection.

It keeps sockets and framing: every call goes to its `RequestPath`, and its `Ledger` holds the
call until it has ended. Every refused or failed request becomes a gRPC status naming what is
wrong (a failed record, poisoned work or a failed pipeline also its `ErrorReply`, in the
trailing metadata `loadax-error-bin`); the server keeps serving. Memory stays bounded: few
batches load at once, each client has few calls in flight, and a call counts until its reply has
left (gRPC holds a reply its client does not read). Optionally TLS (mutual, with a client CA)
secures the connection and a shared token must come with every Worker call; health checks and
reflection stay open to probes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import socket
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, wait
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from loadax.errors import WorkerError
from loadax.server.admission import Admission, Transport
from loadax.server.config_security import TlsConfig
from loadax.server.handler_pool import HandlerPool
from loadax.server.ledger import Held, Ledger
from loadax.server.metrics import WorkerMetrics
from loadax.server.request_path import RequestPath
from loadax.server.worker import Worker
from loadax.validation import require_int
from loadax.wire.failures import (
    ERROR_METADATA,
    PipelineFailed,
    PoisonFailed,
    RecordFailed,
    error_reply,
    shorten,
)
from loadax.wire.limits import GRPC_MIN_PING_INTERVAL_MS, MAX_BATCH_BYTES, MAX_REQUEST_BYTES
from loadax.wire.messages import RequestMessage
from loadax.wire.payloads import (
    HEARTBEAT,
    HEARTBEAT_METADATA,
    HEARTBEAT_MS_RANGE,
    PAYLOAD_SERVICE,
    EncodedBatch,
    payload_reply,
    stream_messages,
)
from loadax.wire.v1 import worker_pb2 as wire

SERVICE = wire.DESCRIPTOR.services_by_name["Worker"].full_name
HEALTH_CHECK_S = 0.5
"""How often the health service's status follows whether the worker can load."""
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
MAX_DETAILS = 4000
"""Status details travel in a header: keep them well under the client's metadata limit."""
_TRANSPORT = Transport(
    "grpc",
    send_token="send the metadata 'authorization: Bearer <token>'",
    counted="LoadBatch calls",
    batches_only=True,
    max_reply_bytes=MAX_BATCH_BYTES,
)

R = TypeVar("R")
Q = TypeVar("Q", bound=Message)


class GrpcServer:
    """Serves `worker` on `address` ("host:port"; port 0 picks a free port).

    `threads` batches load at once, shared fairly between the clients waiting; a client (a
    connection, by `context.peer()`, and the id its requests name: see `RequestPath.arrive`)
    may have `max_in_flight_per_client` LoadBatch calls in flight, and the server holds at most
    `max_concurrent_rpcs` calls, each on a handler thread (idle ones leave); beyond either,
    calls get RESOURCE_EXHAUSTED. A LoadBatch call counts, and its batch keeps its share of
    the worker's memory budget, until the call has ended: its reply sent, or the call
    cancelled (the client gone too). A connection may have `max_concurrent_rpcs` calls open at
    once; more are refused (HTTP/2 REFUSED_STREAM, which a gRPC client reports as UNAVAILABLE).
    A batch of more than `max_reply_bytes` (a client takes `MAX_BATCH_BYTES`) is refused with
    INVALID_ARGUMENT, before it is built when its size is known.

    With `tls` the server speaks only TLS; with `token`, Worker calls without the metadata
    `authorization: Bearer <token>` get UNAUTHENTICATED. Every Worker call is counted in
    `metrics` (by default, metrics of its own).
    """

    def __init__(
        self,
        worker: Worker,
        address: str,
        *,
        threads: int,
        max_in_flight_per_client: int,
        max_concurrent_rpcs: int = 128,
        max_reply_bytes: int = MAX_BATCH_BYTES,
        tls: TlsConfig | None = None,
        token: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        require_int("max_reply_bytes", max_reply_bytes, minimum=1)
        requests = RequestPath(
            worker,
            dataclasses.replace(_TRANSPORT, max_reply_bytes=max_reply_bytes),
            threads=threads,
            max_in_flight_per_client=max_in_flight_per_client,
            token=token,
            metrics=metrics,
        )
        require_int("max_concurrent_rpcs", max_concurrent_rpcs, minimum=1)
        self._address = address
        self._tls = tls
        self._requests = requests
        # One handler thread per admitted call, so that a call is counted against its client
        # as soon as it arrives rather than when a busy pool gets round to it, and waits its
        # turn for a loading slot. gRPC counts a call against `maximum_concurrent_rpcs` from
        # its submission to this pool until its handler returns, so the pool needs no more
        # threads than that; they leave once idle.
        self._executor = HandlerPool(max_concurrent_rpcs, "loadax-grpc")
        self._server = grpc.server(
            self._executor,
            interceptors=[] if token is None else [_TokenCheck(requests.admission)],
            maximum_concurrent_rpcs=max_concurrent_rpcs,
            options=[
                ("grpc.max_send_message_length", max_reply_bytes),
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                # What one connection can have the worker hold: every call it opens has state
                # in the worker until its status is sent, which waits for a client that does
                # not read. Its calls beyond this many at once are refused (REFUSED_STREAM).
                ("grpc.max_concurrent_streams", max_concurrent_rpcs),
                # Two workers must not silently share a port.
                ("grpc.so_reuseport", 0),
                # Accept older clients' keepalive pings, between calls too (they find a frozen
                # worker with them); only pings faster than theirs are strikes. Clients that
                # take heartbeats send none.
                ("grpc.keepalive_permit_without_calls", 1),
                # (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS)
                ("grpc.http2.min_ping_interval_without_data_ms", GRPC_MIN_PING_INTERVAL_MS),
            ],
        )
        servicer = WorkerServicer(requests)
        methods = {
            "Handshake": _method(servicer.Handshake, wire.HandshakeRequest, wire.HandshakeResponse),
            "Info": _method(servicer.Info, wire.InfoRequest, wire.InfoResponse),
            "LoadBatch": _method(servicer.LoadBatch, wire.BatchRequest, wire.BatchResponse),
        }
        payloads = {
            "LoadBatch": _method(servicer.load_raw, wire.BatchRequest),
            "StreamBatch": grpc.unary_stream_rpc_method_handler(
                _parsing(servicer.stream_batch, wire.BatchRequest)
            ),
        }
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(SERVICE, methods),
                grpc.method_handlers_generic_handler(PAYLOAD_SERVICE, payloads),
            )
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        health_service = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection(
            (SERVICE, health_service, reflection.SERVICE_NAME), self._server
        )
        self._worker = worker
        self._started = False
        self._stopping = threading.Event()
        self._health_watch = threading.Thread(
            target=self._watch_health, name="loadax-grpc-health", daemon=True
        )

    @property
    def ledger(self) -> Ledger:
        """What the server holds for its clients until their calls have ended."""
        return self._requests.ledger

    def start(self) -> str:
        """Listen and serve; returns the bound "host:port" (with the port that was picked)."""
        if self._started:
            raise RuntimeError("the gRPC server is started already")
        host = self._address.rpartition(":")[0]
        try:
            if self._tls is None:
                port = self._server.add_insecure_port(self._address)
            else:
                credentials = grpc.ssl_server_credentials(
                    [(self._tls.private_key, self._tls.cert_chain)],
                    root_certificates=self._tls.client_ca,
                    require_client_auth=self._tls.client_ca is not None,
                )
                port = self._server.add_secure_port(self._address, credentials)
        except RuntimeError as error:
            raise OSError(
                f"gRPC cannot listen on {self._address}: {_why_not(self._address)} ({error})"
            ) from error
        if not port:
            raise OSError(f"gRPC cannot listen on {self._address}: {_why_not(self._address)}")
        self._server.start()
        self._started = True
        for service in ("", SERVICE):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._health_watch.start()
        return f"{host}:{port}"

    def _watch_health(self) -> None:
        """Report NOT_SERVING while the worker cannot load (`Worker.serving`), SERVING again
        when it can; the stop's NOT_SERVING is final."""
        serving = True
        while not self._stopping.wait(HEALTH_CHECK_S):
            now = self._worker.serving
            if now != serving:
                serving = now
                status = health_pb2.HealthCheckResponse.SERVING if now else _NOT_SERVING
                for service in ("", SERVICE):
                    self._health.set(service, status)

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, refuse new calls and those waiting to load, let the loading ones
        finish (up to `grace` seconds; later ones are cancelled), then return once no handler
        runs any more."""
        self._stopping.set()
        if self._health_watch.is_alive():
            self._health_watch.join()
        self._health.enter_graceful_shutdown()
        self._requests.stop()
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=True)


class _TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]
    """Refuses Worker calls without the right `authorization` metadata before their request is
    parsed; other services (health, reflection) pass."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._prefixes = (f"/{SERVICE}/", f"/{PAYLOAD_SERVICE}/")

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        if not details.method.startswith(self._prefixes):
            return continuation(details)
        credentials = [
            value if isinstance(value, bytes) else value.encode("utf-8", "replace")
            for key, value in details.invocation_metadata or ()
            if key == "authorization"
        ]
        try:
            self._admission.authenticate(credentials)
        except WorkerError as error:
            return self._refusal(details.method.rpartition("/")[2], error)
        return continuation(details)

    def _refusal(self, method: str, error: WorkerError) -> Any:
        """A handler that answers `error`; the request stays unparsed bytes."""

        def refuse(request: bytes, context: Any) -> None:
            self._admission.refuse(method, context.peer(), error)
            _abort(context, error)

        return grpc.unary_unary_rpc_method_handler(refuse)


class WorkerServicer:
    """The `loadax.wire.v1.Worker` service: every call takes the request path and is held in its
    ledger until the call has ended; an error becomes the call's status."""

    def __init__(self, requests: RequestPath) -> None:
        self._requests = requests

    def Handshake(self, request: wire.HandshakeRequest, context: Any) -> wire.HandshakeResponse:
        with self._held(request, context) as held:
            self._admit(request, context, held)
            return _replied(context, self._requests.answer(request, held))

    def Info(self, request: wire.InfoRequest, context: Any) -> wire.InfoResponse:
        with self._held(request, context) as held:
            self._admit(request, context, held)
            return _replied(context, self._requests.answer(request, held))

    def LoadBatch(self, request: wire.BatchRequest, context: Any) -> wire.BatchResponse:
        """The schema's method: the header with the payload inside (one more copy)."""
        with self._held(request, context) as held:
            batch = self._batch(request, context, held)
            response = batch.header
            response.payload = batch.payload
            return response

    def load_raw(self, request: wire.BatchRequest, context: Any) -> bytes:
        """The raw unary reply: the header, then the payload (`payload_reply`)."""
        with self._held(request, context) as held:
            batch = self._batch(request, context, held)
            return payload_reply(batch.header, batch.frames)

    def stream_batch(self, request: wire.BatchRequest, context: Any) -> Iterator[bytes]:
        """The raw stream's messages: heartbeats while the batch is made if the client asks
        (`HEARTBEAT_METADATA`), then the header and the payload (`stream_messages`). gRPC
        sends each before it asks for the next, and drops the rest when the call ends."""
        with self._held(request, context) as held:
            every = _heartbeat_interval(context)
            make = functools.partial(self._batch, request, context, held)
            batch = make() if every is None else (yield from _beating(make, every))
            yield from stream_messages(batch)

    def _batch(self, request: wire.BatchRequest, context: Any, held: Held) -> EncodedBatch:
        """A batch, given up as soon as the client stops waiting while the call waits its turn."""
        self._admit(request, context, held)
        # Run once the call has ended: cancelled, it need not wait for a loading slot.
        context.add_callback(self._requests.recheck)
        return _replied(context, self._requests.answer(request, held, context.is_active))

    def _admit(self, request: RequestMessage, context: Any, held: Held) -> None:
        refusal = self._requests.admit(request, held)
        if refusal is not None:
            _abort(context, refusal)

    @contextlib.contextmanager
    def _held(self, request: RequestMessage, context: Any) -> Iterator[Held]:
        """The call's entry in the ledger (its client: the connection, and the id `request`
        names), let go of once the call has ended and its handler has returned, whichever is
        last. gRPC keeps a unary reply after its handler returns, until the client has taken
        it; a streaming handler returns once gRPC has sent its last message, or dropped the
        rest. The call ends when its status has been sent after the
        replies, or when it was cancelled (the client cancelled it, went away, or its
        connection broke)."""
        peer = context.peer()
        ledger = self._requests.ledger
        held = self._requests.arrive(peer, peer, request, until=2)
        # Run by gRPC once the call has ended; False when it has ended already.
        if not context.add_callback(functools.partial(ledger.done, held)):
            ledger.done(held)
        try:
            yield held
        finally:
            ledger.done(held)


def _heartbeat_interval(context: Any) -> float | None:
    """The seconds between the heartbeats the call's client asks for, if it does; a value that
    is not a whole number of milliseconds in `HEARTBEAT_MS_RANGE` ends the call with
    INVALID_ARGUMENT."""
    for key, value in context.invocation_metadata() or ():
        if key == HEARTBEAT_METADATA:
            low, high = HEARTBEAT_MS_RANGE
            if not (isinstance(value, str) and value.isdigit() and low <= int(value) <= high):
                _abort(
                    context,
                    WorkerError(
                        "INVALID_ARGUMENT",
                        f"the metadata {HEARTBEAT_METADATA} must be a whole number of "
                        f"milliseconds from {low} to {high}, not {shorten(str(value), 40)!r}",
                    ),
                )
            return int(value) / 1000
    return None


def _beating(make: Callable[[], R], every: float) -> Generator[bytes, None, R]:
    """What `make()` returns or raises, made on a thread of its own while this yields a
    `HEARTBEAT` at once and then every `every` seconds. A call dropped meanwhile still waits
    for `make()`, as its handler thread would have."""
    made: Future[R] = Future()

    def run() -> None:
        try:
            made.set_result(make())
        except BaseException as error:  # context.abort's too: raised in the handler's thread
            made.set_exception(error)

    maker = threading.Thread(target=run, name="loadax-grpc-batch", daemon=True)
    maker.start()
    try:
        yield HEARTBEAT
        while wait([made], every).not_done:
            yield HEARTBEAT
    finally:
        maker.join()
    return made.result()


def _method(
    handler: Callable[[Q, Any], Any], request: type[Q], response: type[Message] | None = None
) -> grpc.RpcMethodHandler:
    """A unary method whose handler parses its request itself (`_parsing`)."""
    return grpc.unary_unary_rpc_method_handler(
        _parsing(handler, request),
        response_serializer=None if response is None else response.SerializeToString,
    )


def _parsing(handler: Callable[[Q, Any], R], request: type[Q]) -> Callable[[bytes, Any], R]:
    """`handler`, given the request's bytes parsed: when gRPC's own parsing fails, its server
    answers but never finishes the call (it aborts it a second time), and keeps the call, its
    stream and about 15 KiB, for as long as it runs (grpcio 1.85). A body that does not parse
    gets the status gRPC answers, INTERNAL, and the call ends."""

    def parsed(body: bytes, context: Any) -> R:
        message = request()
        try:
            message.ParseFromString(body)
        except DecodeError:
            context.abort(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
        return handler(message, context)

    return parsed


def _replied(context: Any, reply: R | WorkerError) -> R:
    """`reply`; an error ends the call with it as its status instead."""
    if isinstance(reply, WorkerError):
        _abort(context, reply)
    return reply


def _abort(context: Any, error: WorkerError) -> NoReturn:
    """End the call with `error` as its status; what failed (a record, poisoned work, the
    pipeline) goes in the trailing metadata, so that the client raises what a local loader
    would."""
    status = grpc.StatusCode.__members__.get(error.code, grpc.StatusCode.UNKNOWN)
    if isinstance(error, RecordFailed | PoisonFailed | PipelineFailed):
        context.set_trailing_metadata(((ERROR_METADATA, error_reply(error).SerializeToString()),))
    context.abort(status, shorten(error.message, MAX_DETAILS))
    raise AssertionError("context.abort returned")  # pragma: no cover


def _why_not(address: str) -> str:
    """Why a socket cannot listen on `address` ("host:port"), as the OS says it (e.g. "address
    already in use"); gRPC's own error does not say."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, ValueError) as error:
        return f"the address does not resolve: {error}"
    for family, kind, protocol, _, where in infos:
        with socket.socket(family, kind, protocol) as probe:
            try:
                probe.bind(where)
            except OSError as error:
                return (error.strerror or str(error)).lower()
    return "gRPC refused it"
