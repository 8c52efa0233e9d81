"""The one decoder of batch replies, whichever transport received them: every reply is verified
before anyone sees its batch, and every failure is mapped here to what the training loop sees.

A reply must name the pipeline identity and the request it answers (by the request's digest),
its payload must match the checksum in its header, and its batch must decode and fit the schema
the worker announced in its handshake (tree, dtypes, dimensions, and the rows asked for). A reply
that fails is the worker's fault, not the caller's: a DATA_LOSS `WorkerError` naming the worker
and what differed, which the dispatcher treats like any failed request (another worker is
asked). A worker's failed record becomes the `loadax.RecordError` a local loader raises.

A local member's reply (`InProcess`) names the request object it answered instead of its digest,
and one of kind threads hands its batch over, not its encoding: its identity, request, schema
and rows are checked, as a worker's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

from loadax.client.transports.reply import InProcess, Reply, bad_reply
from loadax.errors import RecordError, WorkerError
from loadax.wire.checksum import available, kind_name, payload_checksum
from loadax.wire.codec import CodecError, decode_frames
from loadax.wire.failures import RecordFailed
from loadax.wire.plans import request_digest, request_plan
from loadax.wire.schema import schema_difference
from loadax.wire.v1 import worker_pb2 as wire

Buffer = bytes | memoryview


class ReplyDecoder:
    """Verifies and decodes the batch replies of the worker named `worker`; `learn` each of its
    handshake responses, whose schemas the batches are checked against."""

    def __init__(self, worker: str) -> None:
        self._worker = worker
        # By (pipeline, fingerprint): a batch is checked against its own identity's schema.
        self._schemas: dict[tuple[str, str], wire.BatchSchema] = {}

    def learn(self, response: wire.HandshakeResponse) -> wire.HandshakeResponse:
        """Remember the schema the worker announced for a pipeline; returns `response`."""
        key = (response.pipeline, response.fingerprint)
        if response.HasField("schema"):
            self._schemas[key] = response.schema
        else:
            self._schemas.pop(key, None)
        return response

    def verify(self, request: wire.BatchRequest, reply: Future[Reply]) -> Any:
        """The batch of the transport's finished `reply` to `request`, once it passes every
        check (`decode`). A cancelled reply raises `CancelledError`; a failed one, what the
        training loop sees of its `WorkerError` (`failure`: a failed record's `RecordError`,
        with its cause); any other exception, a transport's bug, as it is."""
        if not reply.done():
            raise ValueError(f"verify a reply once it is done; {self._worker}'s is not")
        if reply.cancelled():
            raise CancelledError
        error = reply.exception()
        if isinstance(error, WorkerError):
            failure = self.failure(error)
            raise failure from failure.__cause__  # a RecordError keeps its cause
        if error is not None:
            raise error
        answer = reply.result()
        if answer.local is None:
            return self.decode(request, answer.header, answer.payload, answer.checksum)
        return self._local(request, answer, answer.local)

    def decode(
        self,
        request: wire.BatchRequest,
        header: wire.BatchResponse,
        payload: Sequence[Buffer],
        checksum: int | None = None,
    ) -> Any:
        """The batch that answers `request`, once `header` and `payload` (the frames of its
        encoding) pass every check; its arrays are read-only views of the frames, which they
        keep alive. `checksum`: the payload's, of the kind the header names, if the transport
        computed it as the bytes came (else computed here). A check that fails is a DATA_LOSS
        `WorkerError` saying what differed."""
        self._made_by(request, header)
        if header.request_digest != request_digest(request):
            raise self._another(request, header)
        return self._fitted(request, self._decoded(request, header, payload, checksum))

    def _local(self, request: wire.BatchRequest, reply: Reply, local: InProcess) -> Any:
        """The batch of a local member's `reply` to `request`, checked as `decode` checks a
        worker's, by the request object it answered instead of its digest; a batch handed over
        is not decoded (`InProcess`)."""
        self._made_by(request, reply.header)
        if local.answers is not request:
            raise self._another(request, reply.header)
        if local.handed_over:
            return self._fitted(request, local.batch)
        batch = self._decoded(request, reply.header, reply.payload, reply.checksum)
        return self._fitted(request, batch)

    def _made_by(self, request: wire.BatchRequest, header: wire.BatchResponse) -> None:
        """Refuse a reply whose `header` names another pipeline identity than `request`'s."""
        if header.fingerprint != request.fingerprint:
            raise self.refusal(
                request,
                f"it was made by pipeline identity {header.fingerprint[:12] or 'none'}, this "
                f"client asked for {request.fingerprint[:12]}",
            )

    def _another(self, request: wire.BatchRequest, header: wire.BatchResponse) -> WorkerError:
        return self.refusal(request, f"it answers another request (of step {header.step})")

    def _decoded(
        self,
        request: wire.BatchRequest,
        header: wire.BatchResponse,
        payload: Sequence[Buffer],
        checksum: int | None,
    ) -> Any:
        """The batch `payload` encodes, once its size and checksum are the header's."""
        size = sum(memoryview(frame).nbytes for frame in payload)
        if size != header.payload_size:
            raise self.refusal(
                request, f"its payload has {size} bytes, its header says {header.payload_size}"
            )
        if not available(header.checksum_kind):
            raise self.refusal(
                request,
                f"its checksum is a {kind_name(header.checksum_kind)}, which this client "
                "cannot compute",
            )
        if checksum is None:
            checksum = payload_checksum(payload, header.checksum_kind)
        if checksum != header.checksum:
            raise self.refusal(
                request,
                f"its payload's checksum is {checksum:016x}, its header says "
                f"{header.checksum:016x}",
            )
        try:
            return decode_frames(payload)
        except CodecError as error:
            raise self.refusal(request, f"its payload does not decode: {error}") from error

    def _fitted(self, request: wire.BatchRequest, batch: Any) -> Any:
        """`batch`, once it fits the schema of `request`'s identity and holds its rows."""
        schema = self._schemas.get((request.pipeline, request.fingerprint))
        if schema is not None:
            difference = schema_difference(batch, schema, self._rows(request))
            if difference is not None:
                raise self.refusal(request, difference)
        return batch

    def _rows(self, request: wire.BatchRequest) -> int | None:
        """How many rows the batch that answers `request` holds; None for a window (they
        vary)."""
        if request.HasField("window"):
            return None
        if request.rows:
            return len(request.rows)
        try:
            return request_plan(request.plan).batch_length(request.step)
        except (WorkerError, IndexError):
            return None  # a request the worker refuses: no batch to count

    def failure(self, error: WorkerError) -> WorkerError | RecordError:
        """What the training loop sees of the worker's `error`: the `RecordError` a local loader
        would raise for a failed record, the error itself otherwise."""
        return error.rebuild(self._worker) if isinstance(error, RecordFailed) else error

    def refusal(self, request: wire.BatchRequest, difference: str) -> WorkerError:
        """The DATA_LOSS error that refuses the reply to `request` for `difference` (e.g. a
        transport's framing that does not hold)."""
        return bad_reply(self._worker, request, difference)
