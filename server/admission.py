"""The worker's policy for requests, written once for both transports: who is let in, how many
requests a client may have in flight, and what a refusal or a failure answers.

The servers keep only what is theirs: where a request's credentials and client come from, and
how a reply or a refusal travels.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from loadax.errors import WorkerError
from loadax.logfields import fields
from loadax.server.ledger import Held, Ledger
from loadax.server.metrics import WorkerMetrics
from loadax.server.throttled_log import ThrottledLog
from loadax.wire.credentials import bearer
from loadax.wire.messages import RequestMessage, method_of
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)
R = TypeVar("R")

MAX_CLIENT_ID = 128
"""The longest client id a request may name (a loader sends 32 hex digits)."""
CLIENTS_PER_CONNECTION = 8
"""A connection may have this many clients' in-flight limits of requests in flight at once, over
all the clients it carries (loaders sharing it, or clients behind a proxy): the ids are the
clients' word, so they never let one connection hold more than this."""


@dataclasses.dataclass(frozen=True, slots=True)
class Transport:
    """What differs per transport in the policy: a client is told in its own terms, and each
    transport bounds what it holds in its own way."""

    name: str
    """The transport's label in the metrics."""
    send_token: str
    """How a client of this transport sends the token, told to one that sent none."""
    counted: str
    """What the in-flight limit counts, e.g. "LoadBatch calls"."""
    batches_only: bool = False
    """Whether only batch requests count against the in-flight limit (gRPC: its handshakes and
    infos are bounded by its calls at once) or every request (ZeroMQ, whose handlers queue)."""
    max_reply_bytes: int | None = None
    """The largest reply this transport sends, headers included; None: no limit of its own."""


class Admission:
    """The policy of one `transport` of a worker.

    With `token`, a request must carry the credential `Bearer <token>`. A client may have
    `max_in_flight` of the requests the transport counts in flight, as `ledger` holds them, and
    a connection `CLIENTS_PER_CONNECTION` times that over all its clients. A client is what
    `ledger` keys it by: a connection, or a connection and the id its requests name. Every
    refusal and failure is counted in `metrics` and logged.
    """

    def __init__(
        self,
        transport: Transport,
        metrics: WorkerMetrics,
        token: str | None,
        max_in_flight: int,
        ledger: Ledger,
    ) -> None:
        self._transport = transport
        self._metrics = metrics
        self._credential = None if token is None else bearer(token)
        self._limit = max_in_flight
        self._connection_limit = CLIENTS_PER_CONNECTION * max_in_flight
        self._ledger = ledger
        self._warnings = ThrottledLog(log)

    def announce(self, response: wire.HandshakeResponse) -> wire.HandshakeResponse:
        """`response` with this transport's in-flight limit, so that a client keeps within it."""
        response.max_in_flight_per_client = self._limit
        return response

    def authenticate(self, credentials: Sequence[bytes]) -> None:
        """UNAUTHENTICATED unless `credentials`, every one the request carries, is exactly the
        expected `Bearer <token>` (compared in constant time); anything passes without a token."""
        if self._credential is None:
            return
        if not credentials:
            raise WorkerError(
                "UNAUTHENTICATED", f"this worker requires a token: {self._transport.send_token}"
            )
        if len(credentials) != 1 or not hmac.compare_digest(credentials[0], self._credential):
            raise WorkerError("UNAUTHENTICATED", "the token is wrong")

    def admit(
        self, request: RequestMessage, held: Held, settle: Callable[[], None] | None = None
    ) -> None:
        """Count `request` (`held` in the ledger) among its client's in flight, if this
        transport counts its kind, or refuse it with RESOURCE_EXHAUSTED when the client has as
        many as it may, once `settle()` (the transport's chance to let go of replies already
        sent) has not made room; or with RESOURCE_EXHAUSTED when its connection has as many as
        all its clients may. It counts until the transport has let its reply go, not until it
        is made: a reply waiting for a client that does not read still counts. A client id
        longer than `MAX_CLIENT_ID` is INVALID_ARGUMENT."""
        if isinstance(request, wire.BatchRequest) and len(request.client) > MAX_CLIENT_ID:
            raise WorkerError(
                "INVALID_ARGUMENT",
                f"the request's client id is {len(request.client)} characters long, more than "
                f"the {MAX_CLIENT_ID} a worker takes",
            )
        if self._transport.batches_only and not isinstance(request, wire.BatchRequest):
            return
        counts = self._ledger.admit(held, self._limit, self._connection_limit)
        if counts is not None and settle is not None:
            settle()
            counts = self._ledger.admit(held, self._limit, self._connection_limit)
        if counts is None:
            return
        client, connection = counts
        counted = self._transport.counted
        if client >= self._limit:
            raise WorkerError(
                "RESOURCE_EXHAUSTED",
                f"this client has {client} {counted} in flight already, the most this worker "
                f"allows (max_in_flight_per_client = {self._limit}); retry when one has "
                "finished",
            )
        raise WorkerError(
            "RESOURCE_EXHAUSTED",
            f"this connection has {connection} {counted} in flight already over all its "
            f"clients, the most this worker allows one connection ({CLIENTS_PER_CONNECTION} x "
            f"max_in_flight_per_client = {self._connection_limit}); retry when one has finished",
        )

    def refuse(
        self, method: str, client: str, error: WorkerError, request: RequestMessage | None = None
    ) -> None:
        """Count and log a request refused on arrival, before it reached the worker (its
        `method` may be any text a client sent; `request`, when it was parsed)."""
        self._metrics.refused(self._transport.name, method, error.code)
        self._log_refusal("refused", method, client, error, request)

    def answer(
        self, request: RequestMessage, client: str, call: Callable[[], R]
    ) -> R | WorkerError:
        """`call()`, the worker's answer to `request`, counted in the metrics; if it fails, the
        error to answer instead: a WorkerError as it is, anything else INTERNAL (a bug in the
        worker, logged with its traceback)."""
        method = method_of(request)
        started = time.perf_counter()
        try:
            return self._metrics.observe(self._transport.name, request, call)
        except WorkerError as error:
            self._log_refusal(
                "failed", method, client, error, request, time.perf_counter() - started
            )
            return error
        except Exception as error:
            pipeline, step = _asked(request)
            log.error(
                "%s from %s failed: INTERNAL %s",
                method,
                client,
                error,
                exc_info=error,
                extra=fields(
                    event="failed",
                    client=client,
                    pipeline=pipeline,
                    step=step,
                    status="INTERNAL",
                    duration_s=time.perf_counter() - started,
                    error=error,
                ),
            )
            return WorkerError("INTERNAL", f"the worker failed: {type(error).__name__}: {error}")

    def _log_refusal(
        self,
        event: str,
        method: str,
        client: str,
        error: WorkerError,
        request: RequestMessage | None,
        duration_s: float | None = None,
    ) -> None:
        # The first line only: the message may hold a traceback of the pipeline's code.
        first_line = error.message.partition("\n")[0]
        pipeline, step = _asked(request)
        self._warnings.warning(
            (client, method, error.code),
            "%s from %s refused: %s %s",
            method,
            client,
            error.code,
            first_line,
            extra=fields(
                event=event,
                client=client,
                pipeline=pipeline,
                step=step,
                status=error.code,
                duration_s=duration_s,
                error=first_line,
            ),
        )


def _asked(request: RequestMessage | None) -> tuple[str | None, int | None]:
    """The pipeline and the step `request` asks for, as far as it names them."""
    if isinstance(request, wire.BatchRequest):
        return request.pipeline, request.step
    if isinstance(request, wire.HandshakeRequest):
        return request.pipeline, None
    return None, None
