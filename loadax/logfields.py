"""The facts a loadax log record carries as fields, not only in its text: one set of names for
the worker and the client, so that a log collector can filter on them (`log_format = "json"`).

A log call passes them with `extra=fields(...)`; a formatter writes those of `NAMES` it finds on
a record (and nothing else a record carries, which may be private).

>>> import logging
>>> from loadax.logfields import fields, of_record
>>> extra = fields(event="refused", client="ipv4:10.0.0.7:4431", status="RESOURCE_EXHAUSTED")
>>> extra
{'event': 'refused', 'client': 'ipv4:10.0.0.7:4431', 'status': 'RESOURCE_EXHAUSTED'}
>>> record = logging.LogRecord("loadax", logging.WARNING, __file__, 1, "refused", (), None)
>>> record.__dict__.update(extra, secret="not a field")
>>> of_record(record)
{'event': 'refused', 'client': 'ipv4:10.0.0.7:4431', 'status': 'RESOURCE_EXHAUSTED'}
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

EVENT = "event"
"""What happened, one word or two joined by "_": "ready", "refused", "failed", "stopped"."""
TARGET = "target"
"""A worker's address as a client names it, e.g. "grpc://10.0.0.5:50051"."""
WORKER = "worker"
"""The addresses a worker listens on, as it logs them."""
PIPELINE = "pipeline"
"""The name of a pipeline."""
STEP = "step"
"""The step (or the window's number) a request asks for."""
CLIENT = "client"
"""The client of a request, as the worker's transport names it."""
STATUS = "status"
"""A status code name, e.g. "OK", "INVALID_ARGUMENT"."""
DURATION_S = "duration_s"
"""Seconds something took."""
ERROR = "error"
"""The first line of the error that happened."""

NAMES = (EVENT, TARGET, WORKER, PIPELINE, STEP, CLIENT, STATUS, DURATION_S, ERROR)
"""Every field name; a formatter writes these, and only these, of a record's attributes."""

Value = str | int | float | Sequence[str] | None


def fields(
    *,
    event: str,
    target: str | None = None,
    worker: str | Sequence[str] | None = None,
    pipeline: str | None = None,
    step: int | None = None,
    client: str | None = None,
    status: str | None = None,
    duration_s: float | None = None,
    error: BaseException | str | None = None,
) -> dict[str, Value]:
    """The `extra=` of a log call: the facts given (None: left out); an exception's first line
    (its type name and message) stands for it."""
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    if error is not None:
        error = error.partition("\n")[0]
    given: dict[str, Value] = {
        EVENT: event,
        TARGET: target,
        WORKER: worker if worker is None or isinstance(worker, str) else list(worker),
        PIPELINE: pipeline,
        STEP: step,
        CLIENT: client,
        STATUS: status,
        DURATION_S: None if duration_s is None else round(duration_s, 6),
        ERROR: error,
    }
    return {name: value for name, value in given.items() if value is not None}


def of_record(record: logging.LogRecord) -> dict[str, Value]:
    """The fields `record` carries (those of `NAMES`), in their order."""
    return {name: record.__dict__[name] for name in NAMES if name in record.__dict__}
