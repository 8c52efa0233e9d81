"""The worker's service over ZeroMQ: what a message read off the server's ROUTER socket becomes.

A request is authenticated, parsed and admitted on the worker's `RequestPath`, then handled on a
thread of its own, whose reply goes back to the I/O thread over an inproc PUSH/PULL pair, or, for
a batch whose client has a data socket and asked for it there, is written to that socket by the
handler (`loadax.server.zmq_data`). A client's cancel lets go of its request at once when no
handler has taken it yet, ends its wait for a loading slot, or drops its reply once loaded.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import zmq

from loadax.errors import WorkerError
from loadax.server.handler_pool import HandlerPool
from loadax.server.ledger import Held
from loadax.server.request_path import RequestPath
from loadax.server.throttled_log import ThrottledLog
from loadax.server.zmq_data import DataPort
from loadax.server.zmq_outbox import Outbox, tracked_frames
from loadax.wire import zmq_frames
from loadax.wire.credentials import BEARER
from loadax.wire.messages import RequestMessage
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)

_REPLIES = "inproc://loadax-zmq-replies"
_SETTLE_S = 0.02  # how long a request over its client's limit waits for the client's oldest reply
# Requests handled at once, each on a thread of its own (idle ones leave), so that batch requests
# wait their turn for a loading slot (fairly between clients) rather than in arrival order; as
# many as a gRPC worker's calls by default. More wait for a thread in arrival order.
_HANDLERS = 128


class ZmqService:
    """Takes the messages the I/O thread reads (`take`) and hands their replies back to it
    (`open`); `threads` batches load at once. A request that arrives once `stopping` is set is
    refused with UNAVAILABLE."""

    def __init__(
        self,
        requests: RequestPath,
        outbox: Outbox,
        threads: int,
        stopping: threading.Event,
        data: DataPort | None = None,
    ) -> None:
        self._requests, self._outbox, self._stopping = requests, outbox, stopping
        self._data = data  # the data port, when the server has one (`loadax.wire.zmq_data`)
        self._warnings = ThrottledLog(log)
        # Its threads start with the first requests.
        self._pool = HandlerPool(max(threads, _HANDLERS), "loadax-zmq-handler")
        # Handler threads share one PUSH socket; the lock is what makes that safe.
        self._push_lock = threading.Lock()
        self._push: zmq.Socket[bytes] | None = None
        # The requests admitted and not answered yet, by routing identity and request id, that
        # a cancel may find; the I/O thread adds them, the handlers and cancels take them.
        self._admitted_lock = threading.Lock()
        self._admitted: dict[tuple[bytes, int], _Admitted] = {}
        # The replies being written to data sockets, by client: a client may read one and ask
        # again before its handler has let go of its request (`_settle`).
        self._writing = threading.Condition()
        self._writes: collections.Counter[object] = collections.Counter()

    def open(self, context: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        """The socket the I/O thread reads the handlers' replies from, each [identity, *frames]
        to send on as it is (a single frame: `wake`)."""
        replies = context.socket(zmq.PULL)
        # Replies are bounded by the requests admitted, so the inproc pipe needs no limit.
        replies.setsockopt(zmq.RCVHWM, 0)
        replies.bind(_REPLIES)
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(_REPLIES)
        self._push = push
        return replies

    def wake(self) -> None:
        """Wake the I/O thread with a message of one frame."""
        with self._push_lock:
            if self._push is not None:
                self._push.send(b"")

    def close(self) -> None:
        """Drop the replies still to come, and stop the handler threads: awaited when no request
        is held any more; else they may still run, not awaited."""
        with self._push_lock:
            if self._push is not None:
                self._push.close(linger=0)
                self._push = None
        self._pool.shutdown(wait=self._requests.ledger.in_flight == 0, cancel_futures=True)

    def take(
        self, identity: bytes, frames: Sequence[zmq_frames.Buffer], data_socket: bool = False
    ) -> list[zmq_frames.Buffer] | None:
        """Take the `frames` of a message from the connection of routing `identity`, on the
        ROUTER socket or on its `data_socket` (a batch request or a cancel, without the token:
        the socket's hello named a nonce offered to a handshake that passed the token check):
        what to answer at once on the ROUTER socket (the refusal, [identity, *frames]), if
        anything."""
        try:
            request_id = zmq_frames.parse_request_id(frames[0]) if frames else None
        except WorkerError:
            request_id = None
        if request_id is None:
            self._warnings.warning(
                (identity, "no request id"),
                "dropped a message of %d frames from %s: no request id to answer",
                len(frames),
                client_name(identity),
            )
            return None
        client = client_name(identity)
        try:
            # The token first: a request without the right one is refused unparsed.
            token = zmq_frames.request_token(frames)
            if not data_socket:
                self._requests.admission.authenticate([] if token is None else [BEARER + token])
            cancelled = zmq_frames.parse_cancel(frames)
            if cancelled is not None:
                self._cancel((identity, cancelled))
                return None
            request = zmq_frames.parse_request(frames)
            if data_socket:
                self._check_on_data_socket(identity, request.message)
            if self._stopping.is_set():
                raise WorkerError("UNAVAILABLE", "the worker is shutting down")
        except WorkerError as error:
            # The method frame as sent: the metrics count unknown ones as such.
            method = bytes(frames[1][:64]).decode("ascii", "replace") if len(frames) > 1 else ""
            self._requests.admission.refuse(method, client, error)
            return [identity, *zmq_frames.error_frames(request_id, error)]
        held = self._requests.arrive(identity, client, request.message)
        # A client at its limit is refused only once its replies have had a moment to be let
        # go of (`_settle`).
        refusal = self._requests.admit(
            request.message, held, settle=lambda: self._settle(held.client)
        )
        if refusal is not None:
            self._requests.ledger.done(held)
            return [identity, *zmq_frames.error_frames(request_id, refusal)]
        key = (identity, request_id)
        admitted = _Admitted(held)
        with self._admitted_lock:
            self._admitted[key] = admitted
        admitted.task = self._pool.submit(self._handle, key, admitted, request)
        return None

    def _check_on_data_socket(self, identity: bytes, message: RequestMessage) -> None:
        """Refuse `message`, which came on the data socket of the connection of routing
        `identity`, unless it is a batch request for a pipeline that connection shook hands for
        (the token is not on the socket)."""
        if not isinstance(message, wire.BatchRequest):
            raise WorkerError(
                "INVALID_ARGUMENT",
                "only batch requests and cancels come on a data socket, got a "
                f"{type(message).__name__}",
            )
        if self._data is None or not self._data.may_ask(identity, message.pipeline):
            raise WorkerError(
                "UNAUTHENTICATED",
                "a request on a data socket asks only for a pipeline its connection shook "
                f"hands for (with the token), not {message.pipeline[:80]!r}",
            )

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
            self._requests.ledger.done(admitted.held)
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
            self._requests.ledger.done(held)
            log.debug("dropped the reply to request %d of %s: cancelled", request_id, held.name)
            return
        if isinstance(answer, WorkerError):
            self._push_reply(
                identity, held, request_id, zmq_frames.error_frames(request_id, answer)
            )
            return
        if self._data is not None and _data_socket_asked(request.message):
            if isinstance(answer, wire.HandshakeResponse):
                answer.data_port = self._data.port
                answer.data_nonce = self._data.offer(identity, answer.pipeline)
                answer.data_requests = self._data.takes_requests
            elif isinstance(answer, EncodedBatch) and self._written(
                self._data, identity, held, request_id, answer
            ):
                if self._stopping.is_set():
                    self.wake()  # the I/O thread closes once nothing is in flight
                return
        self._push_reply(identity, held, request_id, zmq_frames.reply_frames(request_id, answer))

    def _written(
        self, data: DataPort, identity: bytes, held: Held, request_id: int, answer: EncodedBatch
    ) -> bool:
        """Whether `answer` went on the data socket of the connection `identity` (it has one),
        its request (`held`) let go of once written, or once the socket is gone."""
        with self._writing:
            self._writes[held.client] += 1
        try:
            sent = data.send(identity, request_id, answer)
            if sent:
                self._requests.ledger.done(held)
            return sent
        finally:
            with self._writing:
                self._writes[held.client] -= 1
                if not self._writes[held.client]:
                    del self._writes[held.client]
                self._writing.notify_all()

    def _settle(self, client: object) -> None:
        """Give the replies to `client` still out up to `_SETTLE_S` to be let go of: one it has
        read may not be yet (libzmq tells from a thread of its own, and a handler writing on a
        data socket lets go once its send returns)."""
        self._outbox.settle(client, _SETTLE_S)
        with self._writing:
            self._writing.wait_for(lambda: not self._writes[client], _SETTLE_S)

    def _push_reply(
        self, identity: bytes, held: Held, request_id: int, reply: list[zmq_frames.Buffer]
    ) -> None:
        """Hand `reply` to the I/O thread. Its tracked frames are referred to from this call's
        frame only: the tracker is done once libzmq has sent them and they are freed, and an
        error answered holds the frames its traceback passed through (`_handle`'s among them)
        in a reference cycle until the garbage collector runs, with the client's slot. A reply
        copied whole (`tracked_frames`) lets go of its request as it is handed over."""
        frames, tracker = tracked_frames(reply)
        if tracker is None:
            # Copied whole: nothing of the worker's is held once handed over. Let go of first,
            # so that the I/O thread, woken by it, finds no request in flight when none is.
            self._requests.ledger.done(held)
        with self._push_lock:
            if self._push is None:
                self._requests.ledger.done(held)
                log.warning("dropped the reply to request %d: the server stopped", request_id)
                return
            # Watched before it is sent, so that the I/O thread, which forwards it, looks for
            # it until libzmq is done with it.
            if tracker is not None:
                self._outbox.add(held, tracker)
            try:
                self._push.send_multipart([identity, *frames], copy=tracker is None)
            except zmq.ZMQError:
                self._requests.ledger.done(held)
                log.exception("dropped the reply to request %d", request_id)


@dataclasses.dataclass(eq=False, slots=True)
class _Admitted:
    """A request admitted and not answered yet: its entry in the ledger, its handler's task,
    and whether its client cancelled it."""

    held: Held
    task: Future[None] | None = None
    cancelled: bool = False


def _data_socket_asked(request: RequestMessage) -> bool:
    """Whether `request` asks for a data socket (a handshake), or for its reply on one (a batch
    request)."""
    if isinstance(request, wire.HandshakeRequest | wire.BatchRequest):
        return request.data_socket
    return False


def client_name(identity: bytes) -> str:
    """How the logs name a client: by its routing identity."""
    return f"client {identity.hex()}"
