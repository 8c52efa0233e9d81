"""Errors that loadax raises into the training loop."""

from __future__ import annotations


class RecordError(RuntimeError):
    """A user function or source failed on one record; the cause is chained as `__cause__`.

    >>> from loadax import Batcher, DataLoader, RangeDataset, RecordError
    >>> broken = RangeDataset(0, 4).map(lambda x: 1 // (x - 3))
    >>> try:
    ...     list(DataLoader(Batcher()).batch_size(2).workers(0).build(broken))
    ... except RecordError as error:
    ...     print(error.index, error.epoch, repr(error.__cause__))
    3 0 ZeroDivisionError('integer division or modulo by zero')
    """

    def __init__(self, index: int, epoch: int, cause: BaseException) -> None:
        super().__init__(f"record {index} (epoch {epoch}) failed: {type(cause).__name__}: {cause}")
        self.index = index
        self.epoch = epoch


class WorkerError(RuntimeError):
    """A worker refused or failed a request; `code` is a gRPC status code name.

    >>> from loadax import Batcher, Pipeline, RangeDataset, WorkerError
    >>> from loadax.client import RemoteDataLoader
    >>> from loadax.server.worker import Worker
    >>> worker = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> try:
    ...     RemoteDataLoader([worker], pipeline="images").batch_size(2).build()
    ... except WorkerError as error:
    ...     print(error.code, "|", error.message)
    NOT_FOUND | unknown pipeline 'images': this worker serves ['numbers']
    >>> worker.close()
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
