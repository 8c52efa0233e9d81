"""Errors that loadax raises into the training loop."""

from __future__ import annotations


class RecordError(RuntimeError):
    """A user function or source failed on one record; the cause is chained as `__cause__`."""

    def __init__(self, index: int, epoch: int, cause: BaseException) -> None:
        super().__init__(f"record {index} (epoch {epoch}) failed: {type(cause).__name__}: {cause}")
        self.index = index
        self.epoch = epoch


class WorkerError(RuntimeError):
    """A worker refused or failed a request; `code` is a gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
