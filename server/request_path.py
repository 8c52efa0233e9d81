"""The one path every request to a worker takes, whatever its transport: admitted on arrival,
answered by the `Worker`, and held in the transport's `Ledger` until its reply has left.

The servers keep only sockets and framing: they open a request's entry, hand the request here
(`admit`, then `answer` on a handler thread) and say when their transport has let the reply go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
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
        self._loading = threading.BoundedSemaphore(threads)

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
            self.admission.refuse(method_of(request), held.name, error)
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

    def _load(self, request: wire.BatchRequest, wanted: Callable[[], bool] | None) -> EncodedBatch:
        with self._loading:
            if wanted is not None and not wanted():
                raise WorkerError("CANCELLED", f"step {request.step} was cancelled by the client")
            batch = self._worker.load_batch(request)
        limit = self._transport.max_reply_bytes
        if limit is not None and batch.size > limit - _HEADER_BYTES:
            batch.release()
            raise WorkerError(
                "RESOURCE_EXHAUSTED",
                f"the batch of step {request.step} encodes to {batch.size} bytes, "
                f"more than the {limit} a reply may hold; ask for fewer rows",
            )
        return batch
