"""Errors that loadax raises into the training loop."""

from __future__ import annotations


class RecordError(RuntimeError):
    """A user function or source failed on one record; `cause` is chained as `__cause__`.

    >>> from loadax import Batcher, DataLoader, RangeDataset, RecordError
    >>> broken = RangeDataset(0, 4).map(lambda x: 1 // (x - 3))
    >>> try:
    ...     list(DataLoader(Batcher()).batch_size(2).workers(0).build(broken))
    ... except RecordError as error:
    ...     print(error.index, error.epoch, repr(error.__cause__))
    3 0 ZeroDivisionError('integer division or modulo by zero')
    """

    def __init__(self, index: int, epoch: int, cause: BaseException) -> None:
        kind = cause.type_name if isinstance(cause, RemoteCause) else type(cause).__name__
        super().__init__(f"record {index} (epoch {epoch}) failed: {kind}: {cause}")
        self.index = index
        self.epoch = epoch
        self.__cause__ = cause


class RemoteCause(RuntimeError):
    """What a record's function raised on a worker, as the client rebuilds it: the exception's type
    name and message (exceptions do not travel: there is no pickle on the wire). It is the
    `__cause__` of the `RecordError` a remote loader raises; the worker's traceback is in that
    error's notes.

    >>> from loadax.errors import RecordError, RemoteCause
    >>> str(RecordError(3, 0, RemoteCause("ZeroDivisionError", "division by zero")))
    'record 3 (epoch 0) failed: ZeroDivisionError: division by zero'
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name


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
