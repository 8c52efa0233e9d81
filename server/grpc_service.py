"""The `loadax.wire.v1.Worker` service over gRPC: its handlers on the worker's request path, the
token check in front of them, and how a refused or failed request becomes the call's status (a
failed record, poisoned work or a failed pipeline also its `ErrorReply`, in the trailing metadata
`loadax-error-bin`). A batch whose request asks for it on the client's data socket is sent there
(`loadax.server.grpc_data`), and its streamed call ends after its heartbeats.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, wait
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from loadax.errors import WorkerError
from loadax.server.admission import Admission
from loadax.server.grpc_data import GrpcDataPort
from loadax.server.ledger import Held
from loadax.server.request_path import RequestPath
from loadax.wire.failures import (
    ERROR_METADATA,
    PipelineFailed,
    PoisonFailed,
    RecordFailed,
    error_reply,
    shorten,
)
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
MAX_DETAILS = 4000
"""Status details travel in a header: keep them well under the client's metadata limit."""

R = TypeVar("R")
Q = TypeVar("Q", bound=Message)


def worker_handlers(
    requests: RequestPath, data: GrpcDataPort | None = None
) -> tuple[grpc.GenericRpcHandler, ...]:
    """The handlers of the Worker service (the schema's methods) and of its raw payload
    service (`PAYLOAD_SERVICE`: the same batches without a copy into a protobuf), which sends
    batches on the data sockets of `data`, if given, to the requests that ask for it."""
    servicer = WorkerServicer(requests, data)
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
    return (
        grpc.method_handlers_generic_handler(SERVICE, methods),
        grpc.method_handlers_generic_handler(PAYLOAD_SERVICE, payloads),
    )


class TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]
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
    ledger until the call has ended; an error becomes the call's status. With `data`, a
    handshake that asks for a data socket is offered one, and streamed batches go there."""

    def __init__(self, requests: RequestPath, data: GrpcDataPort | None = None) -> None:
        self._requests, self._data = requests, data

    def Handshake(self, request: wire.HandshakeRequest, context: Any) -> wire.HandshakeResponse:
        with self._held(request, context) as held:
            self._admit(request, context, held)
            response = _replied(context, self._requests.answer(request, held))
            if self._data is not None:
                self._data.offer(request, response)
            return response

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
        (`HEARTBEAT_METADATA`), and sent on its data socket if it asks for that, then the header
        and the payload (`stream_messages`), unless sent there. gRPC sends each before it asks
        for the next, and drops the rest when the call ends."""
        with self._held(request, context) as held:
            every = _heartbeat_interval(context)
            make = functools.partial(self._batch_unless_sent, request, context, held)
            batch = make() if every is None else (yield from _beating(make, every))
            if batch is not None:
                yield from stream_messages(batch)

    def _batch_unless_sent(
        self, request: wire.BatchRequest, context: Any, held: Held
    ) -> EncodedBatch | None:
        """The batch, or None once sent on the data socket that `request` names."""
        batch = self._batch(request, context, held)
        if self._data is not None and self._data.send(request, batch):
            return None
        return batch

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
