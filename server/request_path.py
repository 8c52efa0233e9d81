"""The one path every request to a worker takes, whatever its transport: admitted on arrival,
answered by the `Worker`, and held in the transport's `Ledger` until its reply has left.

The servers keep only sockets and framing: they open a request's entry, hand the request here
(`admit`, then `answer` on a handler thread) and say when their transport has let the reply go.
A batch request waits for one of the loading slots; it gives up its wait at once when its client
no longer waits for it (`recheck`) or the server stops (`stop`), so that neither a storm of
cancelled requests nor a shutdown waits for work that nobody will read.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import overload

from loadax.errors import WorkerError
from loadax.server.admission import Admission, Transport
from loadax.server.ledger import Held, Ledger
from loadax.server.metrics import WorkerMetrics
from loadax.server.worker import Worker
from loadax.validation import require_int
from loadax.wire.messages import RequestMessage, ResponseMessage, method_of
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

_HEADER_BYTES = 1024
"""Room left in a reply of `Transport.max_reply_bytes` for what goes with the batch."""


class RequestPath:
    """Serves `worker` to the clients of one `transport`.

    `threads` batches load at once; a client may have `max_in_flight_per_client` of the requests
    the transport counts in flight (`Transport.batches_only`), each until its transport has let
    its reply go. With `token`, requests must carry `Bearer <token>`. Every request is counted
    in `metrics` (by default, metrics of its own).
    """

    def __init__(
        self,
        worker: Worker,
        transport: Transport,
        *,
        threads: int,
        max_in_flight_per_client: int,
        token: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        for name, value in (
            ("threads", threads),
            ("max_in_flight_per_client", max_in_flight_per_client),
        ):
            require_int(name, value, minimum=1)
        self._worker = worker
        self._transport = transport
        self.ledger = Ledger()
        """What this transport holds for its clients until their replies have left."""
        self.admission = Admission(
            transport, metrics or WorkerMetrics(), token, max_in_flight_per_client, self.ledger
        )
        """The policy, for what the transport refuses before a request is parsed."""
        self._slots = _Slots(threads)

    def arrive(self, client: Hashable, name: str, *, until: int = 1) -> Held:
        """The ledger's entry of a request of `client` (`name` in logs) that has arrived, let go
        of once the transport has called `ledger.done` on it `until` times."""
        return self.ledger.open(client, name, until=until)

    def admit(
        self, request: RequestMessage, held: Held, *, settle: Callable[[], None] | None = None
    ) -> WorkerError | None:
        """None when `request` may be answered (counted in `held` against its client's limit);
        else the refusal to send, counted and logged. `settle()`, if given, may let go of
        replies already sent before a client at its limit is refused."""
        try:
            self.admission.admit(request, held, settle)
        except WorkerError as error:
            self.admission.refuse(method_of(request), held.name, error, request)
            return error
        return None

    @overload
    def answer(
        self, request: wire.HandshakeRequest, held: Held, wanted: Callable[[], bool] | None = None
    ) -> wire.HandshakeResponse | WorkerError: ...

    @overload
    def answer(
        self, request: wire.BatchRequest, held: Held, wanted: Callable[[], bool] | None = None
    ) -> EncodedBatch | WorkerError: ...

    @overload
    def answer(
        self, request: wire.InfoRequest, held: Held, wanted: Callable[[], bool] | None = None
    ) -> wire.InfoResponse | WorkerError: ...

    @overload
    def answer(
        self, request: RequestMessage, held: Held, wanted: Callable[[], bool] | None = None
    ) -> ResponseMessage | WorkerError: ...

    def answer(
        self, request: RequestMessage, held: Held, wanted: Callable[[], bool] | None = None
    ) -> ResponseMessage | WorkerError:
        """The worker's reply to `request`, or the error to answer instead (a WorkerError as it
        is, anything else INTERNAL). A batch is held in `held`, its bytes and its share of the
        memory budget, until the transport lets `held` go. A batch request that waited for a
        loading thread is given up (CANCELLED) if `wanted()` says its client no longer waits."""
        reply = self.admission.answer(request, held.name, lambda: self._call(request, wanted))
        if isinstance(reply, EncodedBatch):
            self.ledger.hold(held, reply.size, reply.release)
        return reply

    def _call(self, request: RequestMessage, wanted: Callable[[], bool] | None) -> ResponseMessage:
        if isinstance(request, wire.BatchRequest):
            return self._load(request, wanted)
        if isinstance(request, wire.HandshakeRequest):
            return self.admission.announce(self._worker.handshake(request))
        return self._worker.info(request)

    def recheck(self) -> None:
        """A client stopped waiting for a request: the batch requests waiting for a loading slot
        ask their `wanted()` again."""
        self._slots.wake()

    def stop(self) -> None:
        """The server stops: batch requests not loading yet are answered UNAVAILABLE at once
        (their clients ask another worker); those loading finish."""
        self._slots.close()

    def _load(self, request: wire.BatchRequest, wanted: Callable[[], bool] | None) -> EncodedBatch:
        limit = self._transport.max_reply_bytes
        with self._slots.taken(request.step, wanted):
            return self._worker.load_batch(
                request, None if limit is None else limit - _HEADER_BYTES
            )


class _Slots:
    """`count` slots for batches loading at once; a wait for one ends early, with an error, when
    its client no longer waits or the slots are closed."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._closed = False
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def taken(self, step: int, wanted: Callable[[], bool] | None) -> Iterator[None]:
        """A slot, held for the block: CANCELLED if `wanted()` turns false before one is free,
        UNAVAILABLE if the slots are closed first."""

        def gone() -> bool:
            return wanted is not None and not wanted()

        with self._changed:
            self._changed.wait_for(lambda: self._free or self._closed or gone())
            if self._closed:
                raise WorkerError("UNAVAILABLE", "the worker is shutting down")
            if gone():
                raise WorkerError("CANCELLED", f"step {step} was cancelled by the client")
            self._free -= 1
        try:
            yield
        finally:
            with self._changed:
                self._free += 1
                self._changed.notify_all()  # a waiter whose client has gone passes it on

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
