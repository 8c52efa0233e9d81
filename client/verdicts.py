"""What a failed batch request means: for the request (try another worker, or raise) and for
the worker that failed it (back off briefly, send it less, or quarantine)."""

from __future__ import annotations

import enum

from loadax.errors import WorkerError
from loadax.wire.failures import PipelineFailed, PoisonFailed

# Codes that say nothing about the request itself: another worker may well succeed.
RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})
# The worker is full (its in-flight limit, its memory budget): back-pressure, not a failure.
PRESSURE = "RESOURCE_EXHAUSTED"
# Codes that say the worker is wrong for this loader, not the request: another pipeline identity
# (FAILED_PRECONDITION), no such pipeline (NOT_FOUND), a reply that fails to decode or to verify
# (DATA_LOSS). Another worker will serve the request; this one may be restarted right.
ANOTHER_PIPELINE = frozenset({"FAILED_PRECONDITION", "NOT_FOUND"})
QUARANTINING = ANOTHER_PIPELINE | {"DATA_LOSS"}


class Verdict(enum.Enum):
    """What a failed attempt means for its request and for the worker that failed it."""

    RETRY = "retry"
    """Transient: re-issue the request elsewhere; the worker backs off briefly."""
    PRESSURE = "pressure"
    """The worker is full: re-issue the request; the worker is sent less for a while."""
    QUARANTINE = "quarantine"
    """The worker is wrong for this loader: re-issue the request; the worker is kept off longer."""
    POISON = "poison"
    """The work killed or stalled what loaded it: another worker may be asked (a few at most);
    the worker itself is fine."""
    CONFIRM = "confirm"
    """The pipeline's own code raised making the batch: every worker of its identity would
    repeat it, so one other worker is asked to confirm it before it is raised (a worker whose
    environment is broken is not the pipeline's fault)."""
    FATAL = "fatal"
    """The request itself is wrong (or one of its records fails): every worker would repeat it."""


def serves_another(error: BaseException) -> bool:
    """Whether `error` says its worker serves another pipeline identity, or none for this
    loader (a rolling update replaced its code): no request of this loader will succeed there.

    >>> [serves_another(WorkerError(code, "")) for code in ("FAILED_PRECONDITION", "DATA_LOSS")]
    [True, False]
    """
    return isinstance(error, WorkerError) and error.code in ANOTHER_PIPELINE


def verdict(error: BaseException) -> Verdict:
    """The verdict on an attempt that failed with `error`.

    >>> from loadax.errors import RecordError, WorkerError
    >>> codes = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "NOT_FOUND", "DATA_LOSS", "OUT_OF_RANGE")
    >>> [verdict(WorkerError(code, "")).name for code in codes]
    ['RETRY', 'PRESSURE', 'QUARANTINE', 'QUARANTINE', 'FATAL']
    >>> verdict(RecordError(3, 0, ValueError("corrupt"))).name
    'FATAL'
    """
    if isinstance(error, PoisonFailed):
        return Verdict.POISON
    if isinstance(error, PipelineFailed):
        return Verdict.CONFIRM
    if not isinstance(error, WorkerError):
        return Verdict.FATAL  # a RecordError, or a bug: never hidden by a retry
    if error.code in RETRYABLE:
        return Verdict.RETRY
    if error.code == PRESSURE:
        return Verdict.PRESSURE
    if error.code in QUARANTINING:
        return Verdict.QUARANTINE
    return Verdict.FATAL
