"""Errors on the wire: the `ErrorReply` both transports carry, and a failed record within it.

A record that fails on a worker travels as its parts (index, epoch, the cause's type name and
message, the worker's traceback) under the status RECORD_FAILED, so that the client raises the
`loadax.RecordError` the local loader would: the same error type in every mode. A batch that the
pipeline's own code fails to make (its batcher, say) travels so too, and the client raises the
exception the local loader would: its type, when a client can build it, and its message.
"""

from __future__ import annotations

import builtins
import traceback
from collections.abc import Sequence

import loadax.errors
from loadax.errors import (
    PoisonedRecords,
    RecordError,
    RemoteCause,
    StorageError,
    WorkerError,
    listed,
)
from loadax.wire.v1 import worker_pb2 as wire

RECORD_FAILED = "ABORTED"
"""The status of a reply whose batch has a record that failed: the client raises RecordError,
which another worker would repeat, so it is never retried."""
BAD_REPLY = "DATA_LOSS"
"""The status the client gives a reply that fails its checks (malformed, corrupt, made for another
request or pipeline, or not of the announced schema): the worker's fault, so another worker is
asked."""
ERROR_METADATA = "loadax-error-bin"
"""The gRPC trailing metadata that carries a failed call's `ErrorReply`, for a failed record."""
MAX_TRACEBACK_CHARS = 2000
MAX_CAUSE_CHARS = 500
# gRPC carries a failed record in metadata, which a client accepts up to 8 KiB: the traceback
# (base64, a third longer) and the status details must fit together.


class RecordFailed(WorkerError):
    """A worker's answer that a record of the batch failed, as it travels; `rebuild` gives the
    client's `RecordError`.

    >>> from loadax.errors import RecordError
    >>> from loadax.wire.failures import RecordFailed
    >>> cause = ValueError("bad record")
    >>> failed = RecordFailed.of(RecordError(7, 2, cause), "Traceback ...")
    >>> failed.code, failed.message
    ('ABORTED', 'record 7 (epoch 2) failed: ValueError: bad record')
    >>> rebuilt = failed.rebuild("grpc://10.0.0.5:50051")
    >>> rebuilt.index, rebuilt.epoch, type(rebuilt.__cause__).__name__
    (7, 2, 'RemoteCause')
    >>> print(rebuilt.__notes__[0])
    loadax: raised on grpc://10.0.0.5:50051; the traceback there:
    Traceback ...
    """

    def __init__(self, record: wire.RecordFailure) -> None:
        super().__init__(
            RECORD_FAILED,
            f"record {record.index} (epoch {record.epoch}) failed: {record.cause_type}: "
            f"{record.cause_message}",
        )
        self.record = record

    @classmethod
    def of(cls, error: RecordError, text: str | None = None) -> RecordFailed:
        """The failure `error` reports; `text` is the traceback to send (by default the cause's)."""
        cause = error.__cause__ or error
        if text is None:
            text = "".join(traceback.format_exception(cause))
        return cls(
            wire.RecordFailure(
                index=error.index,
                epoch=error.epoch,
                cause_type=type_name(cause),
                cause_message=shorten(str(cause), MAX_CAUSE_CHARS),
                traceback=shorten(text, MAX_TRACEBACK_CHARS),
            )
        )

    def rebuild(self, worker: str) -> RecordError:
        """The `RecordError` the client raises: its cause a `RemoteCause` with the original type
        name and message, and a note naming `worker` with the traceback it sent."""
        record = self.record
        cause = RemoteCause(record.cause_type, record.cause_message)
        error = RecordError(record.index, record.epoch, cause)
        error.add_note(f"loadax: raised on {worker}; the traceback there:\n{record.traceback}")
        return error


class PoisonFailed(WorkerError):
    """A worker's answer that loading the work killed its process or ran past its deadline: the
    worker itself is fine and keeps serving. The client asks another worker (at most
    `poison_retries` more), then raises `PoisonedRecords` (`rebuild`).

    >>> from loadax.wire.failures import PoisonFailed
    >>> failed = PoisonFailed.of("the batch of step 3", [0, 1], [17, 4], [0, 0], "exited (3)")
    >>> failed.code, failed.message
    ('ABORTED', 'the batch of step 3 (records [17, 4]) was not loaded: exited (3)')
    >>> type(failed.rebuild(["grpc://a:1", "grpc://b:1"])).__name__
    'PoisonedRecords'
    """

    def __init__(self, poisoned: wire.PoisonedWork) -> None:
        super().__init__(
            RECORD_FAILED,
            f"{poisoned.work} (records {listed(poisoned.indices, 8)}) was not loaded: "
            f"{poisoned.reason}",
        )
        self.poisoned = poisoned

    @classmethod
    def of(
        cls,
        work: str,
        rows: Sequence[int],
        indices: Sequence[int],
        epochs: Sequence[int],
        reason: str,
    ) -> PoisonFailed:
        return cls(
            wire.PoisonedWork(
                work=work,
                rows=[int(row) for row in rows],
                indices=[int(index) for index in indices],
                epochs=[int(epoch) for epoch in epochs],
                reason=shorten(reason, MAX_CAUSE_CHARS),
            )
        )

    def rebuild(self, workers: Sequence[str]) -> PoisonedRecords:
        """The error the training loop gets once `workers` have each failed the work so."""
        poisoned = self.poisoned
        return PoisonedRecords(
            poisoned.work,
            list(poisoned.rows),
            list(poisoned.indices),
            list(poisoned.epochs),
            poisoned.reason,
            workers,
        )


class PipelineFailed(WorkerError):
    """A worker's answer that the pipeline's own code (its batcher, the collation, a stream's
    ops, the encoding of the batch) raised while making the batch of a step: a property of the
    pipeline and the step, which any worker would repeat. `rebuild` gives the exception the local
    loader raises: the same type, when it is a builtin or a `loadax.errors` type that a message
    builds, else a `RemoteCause` naming the type; the same message either way.

    >>> from loadax.wire.failures import PipelineFailed
    >>> failed = PipelineFailed.of(ValueError("leaf ['x'] is ragged"), 3, "Traceback ...")
    >>> failed.code, failed.message
    ('ABORTED', "the batch of step 3 failed: ValueError: leaf ['x'] is ragged")
    >>> rebuilt = failed.rebuild("grpc://10.0.0.5:50051")
    >>> type(rebuilt).__name__, str(rebuilt)
    ('ValueError', "leaf ['x'] is ragged")
    >>> print(rebuilt.__notes__[0])
    loadax: raised on grpc://10.0.0.5:50051; the traceback there:
    Traceback ...
    >>> class Custom(Exception): ...
    >>> other = PipelineFailed.of(Custom("no"), 4).rebuild("grpc://10.0.0.5:50051")
    >>> type(other).__name__, other.type_name, str(other)
    ('RemoteCause', 'Custom', 'Custom: no')
    """

    def __init__(self, failure: wire.PipelineFailure) -> None:
        super().__init__(
            RECORD_FAILED,
            f"the batch of step {failure.step} failed: {failure.cause_type}: "
            f"{failure.cause_message}",
        )
        self.failure = failure

    @classmethod
    def of(cls, error: BaseException, step: int, text: str | None = None) -> PipelineFailed:
        """The failure `error`, raised while making the batch of `step`, reports; `text` is the
        traceback to send (by default `error`'s)."""
        if text is None:
            text = "".join(traceback.format_exception(error))
        return cls(
            wire.PipelineFailure(
                step=step,
                cause_type=type_name(error),
                cause_message=shorten(_message(error), MAX_CAUSE_CHARS),
                traceback=shorten(text, MAX_TRACEBACK_CHARS),
                storage_url=error.url if isinstance(error, StorageError) else "",
            )
        )

    def rebuild(self, worker: str) -> Exception:
        """The exception the client raises, with a note naming `worker` and the traceback it
        sent."""
        failure = self.failure
        if failure.storage_url:  # a store's refusal: the worker's store settings are the job's
            error: Exception | None = StorageError(
                failure.cause_message, failure.storage_url, failure.cause_message
            )
        else:
            error = _built(failure.cause_type, failure.cause_message)
        if error is None:
            error = RemoteCause(
                failure.cause_type, f"{failure.cause_type}: {failure.cause_message}"
            )
        error.add_note(f"loadax: raised on {worker}; the traceback there:\n{failure.traceback}")
        return error


def type_name(error: BaseException) -> str:
    """The name of `error`'s type; for one rebuilt from a remote type name, that name."""
    return error.type_name if isinstance(error, RemoteCause) else type(error).__name__


def _message(error: BaseException) -> str:
    """What rebuilds `error` from its type: its only argument when that is text (`KeyError('x')`
    prints quoted), else how it prints."""
    if len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


_REBUILT = (builtins, loadax.errors)
"""Where an exception type named on the wire is looked up: nothing a client imports for it."""


def _built(name: str, message: str) -> Exception | None:
    """An exception of the type `name` in `_REBUILT` made from `message`, or None when there is
    no such type or it is not made from a message alone."""
    for module in _REBUILT:
        kind = getattr(module, name, None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            try:
                error = kind(message)
            except Exception:
                return None
            return error if _message(error) == message else None
    return None


def error_reply(error: WorkerError) -> wire.ErrorReply:
    """The `ErrorReply` that tells a client about `error`."""
    reply = wire.ErrorReply(code=error.code, message=error.message)
    if isinstance(error, RecordFailed):
        reply.record.CopyFrom(error.record)
    elif isinstance(error, PoisonFailed):
        reply.poisoned.CopyFrom(error.poisoned)
    elif isinstance(error, PipelineFailed):
        reply.pipeline.CopyFrom(error.failure)
    return reply


def error_from_reply(reply: wire.ErrorReply) -> WorkerError:
    """The error an `ErrorReply` tells of: a `RecordFailed` when it names a record, a
    `PoisonFailed` when it names poisoned work, a `PipelineFailed` when the pipeline failed."""
    if reply.HasField("record"):
        return RecordFailed(reply.record)
    if reply.HasField("poisoned"):
        return PoisonFailed(reply.poisoned)
    if reply.HasField("pipeline"):
        return PipelineFailed(reply.pipeline)
    return WorkerError(reply.code or "UNKNOWN", reply.message)


def shorten(text: str, limit: int) -> str:
    """`text`, or its start and end with what was left out counted when it is over `limit`."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 5, limit * 3 // 5
    left_out = len(text) - head - tail
    return f"{text[:head]}\n... ({left_out} characters left out) ...\n{text[-tail:]}"
