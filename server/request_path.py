"""The one path every request to a worker takes, whatever its transport: admitted on arrival,
answered by the `Worker`, and held in the transport's `Ledger` until its reply has left.

The servers keep only sockets and framing: they open a request's entry, hand the request here
(`admit`, then `answer` on a handler thread) and say when their transport has let the reply go.
A batch request waits for one of the loading slots, which go to the clients waiting in turn,
by rows (deficit round robin): a client that keeps more requests in flight gets no larger share.
It gives up its wait at once when its client no longer waits for it (`recheck`) or the server
stops (`stop`), so that neither a storm of cancelled requests nor a shutdown waits for work that
nobody will read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar, overload

from loadax.errors import WorkerError
from loadax.server.admission import Admission, Transport
from loadax.server.ledger import Held, Ledger
from loadax.server.load_report import LoadReport
from loadax.server.memory import too_large
from loadax.server.metrics import WorkerMetrics
from loadax.server.same_host import SameHost
from loadax.server.worker import Worker
from loadax.validation import require_int
from loadax.wire.messages import RequestMessage, ResponseMessage, method_of
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

_HEADER_BYTES = 1024
"""Room left in a reply of `Transport.max_reply_bytes` for what goes with the batch."""
T = TypeVar("T")


class RequestPath:
    """Serves `worker` to the clients of one `transport`.

    `threads` batches load at once, shared fairly between the clients waiting; a client may
    have `max_in_flight_per_client` of the requests the transport counts in flight
    (`Transport.batches_only`), each until its transport has let its reply go. With `token`,
    requests must carry `Bearer <token>`. Every request is counted in `metrics` (by default,
    metrics of its own).
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
        self._report = LoadReport(threads)
        self._same_host = SameHost(worker.shared_memory)

    def arrive(
        self, connection: Hashable, name: str, request: RequestMessage, *, until: int = 1
    ) -> Held:
        """The ledger's entry of `request`, arrived over `connection` (`name` in logs), let go
        of once the transport has called `ledger.done` on it `until` times.

        Its client is the connection and the id a batch request names (`client`: each loader
        its own), so that loaders sharing a connection, or clients behind one proxy, are
        counted and served apart; without an id, the connection. The id is the client's word:
        it shares the worker fairly and is no credential (the token is one)."""
        client = request.client if isinstance(request, wire.BatchRequest) else ""
        if not client:
            return self.ledger.open(connection, name, until=until)
        return self.ledger.open(
            (connection, client),
            f"{name} (client {client[:12]!r})",
            until=until,
            connection=connection,
        )

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
        loading thread is given up (CANCELLED) if `wanted()` says its client no longer waits.
        A batch's reply carries the worker's load (`LoadReport`)."""
        if isinstance(request, wire.BatchRequest):
            self._report.arrived()
        reply = self.admission.answer(request, held.name, lambda: self._call(request, held, wanted))
        if isinstance(reply, EncodedBatch):
            reply = self._report.stamp(reply)
            self.ledger.hold(held, reply.size, reply.release)
        return reply

    def _call(
        self, request: RequestMessage, held: Held, wanted: Callable[[], bool] | None
    ) -> ResponseMessage:
        if isinstance(request, wire.BatchRequest):
            return self._load(request, held, wanted)
        if isinstance(request, wire.HandshakeRequest):
            response = self._same_host.announce(request, self._worker.handshake(request))
            response.loading_slots = self._report.slots
            return self.admission.announce(response)
        return self._worker.info(request)

    def recheck(self) -> None:
        """A client stopped waiting for a request: the batch requests waiting for a loading slot,
        or for another request's computation of their batch, ask their `wanted()` again."""
        self._slots.wake()
        self._worker.share_cache.wake()

    def stop(self) -> None:
        """The server stops: batch requests not loading yet are answered UNAVAILABLE at once
        (their clients ask another worker); those loading finish."""
        self._slots.close()

    def _load(
        self, request: wire.BatchRequest, held: Held, wanted: Callable[[], bool] | None
    ) -> EncodedBatch:
        limit = self._transport.max_reply_bytes
        limit = None if limit is None else limit - _HEADER_BYTES

        with self._same_host.file(request, limit) as file:

            def build() -> EncodedBatch:
                with self._slots.taken(held.client, self._rows(request), request.step, wanted):
                    # A payload for the client's memory file is checksummed as it is written there.
                    checksummed = file is None
                    return self._worker.load_batch(
                        request, limit, checksummed=checksummed, into=file
                    )

            # Requests with one digest share one computation, which takes one client's turn.
            batch = self._worker.share_cache.serve(request, build, wanted)
            if limit is not None and batch.size > limit:  # built for a transport that sends more
                batch.release()
                room = f"the {limit} a reply may hold"
                raise too_large(f"the batch of step {request.step}", batch.size, room)
            return self._same_host.place(request, batch, file).checksummed_for(request)

    def _rows(self, request: wire.BatchRequest) -> int:
        """The rows `request` asks for, as its client's turns count them: its rows, else the
        whole batch of its plan, or a stream window's records (at least 1, whatever it asks)."""
        if request.HasField("window"):
            rows = self._windows.get(request.pipeline, 0)
        else:
            rows = len(request.rows) or request.plan.batch_size
        return max(rows, 1)

    @functools.cached_property
    def _windows(self) -> dict[str, int]:
        """The records of a window of each stream pipeline (0: random-access), asked of the
        worker when the first window request comes."""
        return {
            pipeline.name: pipeline.stream_window
            for pipeline in self._worker.info(wire.InfoRequest()).pipelines
        }


class _Slots:
    """`count` slots for batches loading at once, handed to the clients waiting in turn
    (`FairQueue`); a wait for one ends early, with an error, when its client no longer waits or
    the slots are closed."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._closed = False
        self._lock = threading.Lock()
        self._queue: FairQueue[_Waiter] = FairQueue()
        self._waiting: set[_Waiter] = set()

    @contextlib.contextmanager
    def taken(
        self, client: Hashable, rows: int, step: int, wanted: Callable[[], bool] | None
    ) -> Iterator[None]:
        """A slot for a request of `client` for `rows` rows, held for the block: CANCELLED if
        `wanted()` turns false before it has one, UNAVAILABLE if the slots are closed first."""

        def gone() -> bool:
            return wanted is not None and not wanted()

        waiter = _Waiter(threading.Condition(self._lock))
        with self._lock:
            self._queue.put(client, waiter, rows)
            self._waiting.add(waiter)
            self._hand_out()
            waiter.turn.wait_for(lambda: waiter.granted or self._closed or gone())
            self._waiting.discard(waiter)
            if not waiter.granted:
                self._queue.remove(client, waiter)
            error = None
            if self._closed:
                error = WorkerError("UNAVAILABLE", "the worker is shutting down")
            elif gone():
                error = WorkerError("CANCELLED", f"step {step} was cancelled by the client")
            if error is not None:
                if waiter.granted:  # passed on
                    self._free += 1
                    self._hand_out()
                raise error
        try:
            yield
        finally:
            with self._lock:
                self._free += 1
                self._hand_out()

    def _hand_out(self) -> None:
        """Give the free slots to the waiters whose turn it is."""
        while self._free and not self._closed:
            waiter = self._queue.take()
            if waiter is None:
                return
            self._free -= 1
            waiter.granted = True
            waiter.turn.notify()

    def wake(self) -> None:
        """Every waiter asks its `wanted()` again."""
        with self._lock:
            for waiter in self._waiting:
                waiter.turn.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for waiter in self._waiting:
                waiter.turn.notify()


@dataclasses.dataclass(eq=False, slots=True)
class _Waiter:
    """A request waiting for a slot: notified on `turn` once `granted` one, or to look again."""

    turn: threading.Condition
    granted: bool = False


class FairQueue(Generic[T]):
    """Items of several clients, taken by deficit round robin over the clients that have some:
    in turn, each may take items of up to a quantum of cost (the largest cost first in line, so
    that every turn takes one at least), what it leaves unspent kept for its next turn while it
    has items. Clients with items take about the same cost per round, whatever their number of
    items. Thread-compatible: its owner locks.

    >>> queue: FairQueue[str] = FairQueue()
    >>> for item in ("a1", "a2", "a3", "a4"):
    ...     queue.put("greedy", item, cost=4)
    >>> queue.put("modest", "b1", cost=4)
    >>> queue.put("small", "c1", cost=2)
    >>> queue.put("small", "c2", cost=2)
    >>> [queue.take() for _ in range(8)]
    ['a1', 'b1', 'c1', 'c2', 'a2', 'a3', 'a4', None]
    """

    def __init__(self) -> None:
        self._queues: dict[Hashable, deque[tuple[T, int]]] = {}
        self._credit: dict[Hashable, int] = {}
        self._turns: deque[Hashable] = deque()  # the clients with items; the first one's turn

    def put(self, client: Hashable, item: T, cost: int) -> None:
        """Queue `item` of `client`, which costs `cost` (at least 1) of its turns."""
        queue = self._queues.get(client)
        if queue is None:
            queue = self._queues[client] = deque()
            self._credit[client] = 0
            self._turns.append(client)
        queue.append((item, cost))

    def remove(self, client: Hashable, item: T) -> None:
        """Take `item` of `client` out of the queue, unserved."""
        queue = self._queues[client]
        queue.remove(next(entry for entry in queue if entry[0] is item))
        if not queue:
            self._drop(client)

    def take(self) -> T | None:
        """The next item in turn; None when there is none."""
        quantum = 0
        while self._turns:
            client = self._turns[0]
            queue = self._queues[client]
            item, cost = queue[0]
            if self._credit[client] >= cost:
                self._credit[client] -= cost
                queue.popleft()
                if not queue:
                    self._drop(client)
                return item
            # The turn passes on; the next time round, this client may spend a quantum more.
            quantum = quantum or max(queue[0][1] for queue in self._queues.values())
            self._credit[client] += quantum
            self._turns.rotate(-1)
        return None

    def _drop(self, client: Hashable) -> None:
        """`client` has no items left: it leaves the round, and its credit goes."""
        del self._queues[client], self._credit[client]
        self._turns.remove(client)
