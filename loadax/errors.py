"""Errors that loadax raises into the training loop."""

from __future__ import annotations

from collections.abc import Sequence


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


class StorageError(OSError):
    """An object store or filesystem failed a read: the store is at fault, not a record. `url`
    names the object, `reason` is what the store said, and `transient` says whether it was an
    outage (retried until the source's `RetryPolicy` ran out) rather than a refusal such as a
    missing object or denied credentials. Loaders raise it as itself, never as a `RecordError`.

    >>> import pickle
    >>> from loadax import StorageError
    >>> error = StorageError("cannot reach 's3://b/k'", "s3://b/k", "curlCode: 7", transient=True)
    >>> copy = pickle.loads(pickle.dumps(error))
    >>> str(copy), copy.url, copy.reason, copy.transient, isinstance(copy, OSError)
    ("cannot reach 's3://b/k'", 's3://b/k', 'curlCode: 7', True, True)
    """

    def __init__(self, message: str, url: str, reason: str, transient: bool = False) -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason
        self.transient = transient

    def __reduce__(self) -> tuple[object, ...]:
        # OSError pickles as its args alone: these travel to the parent of a loader process too.
        return (type(self), (str(self), self.url, self.reason, self.transient), self.__dict__)


class TooManyBadRecords(RecordError):
    """More records failed than a bad-record policy's budget allows (`on_record_error(...,
    budget=...)`): `error` is the last failure (its `index`, `epoch` and cause are this error's).

    >>> from loadax.errors import RecordError, TooManyBadRecords
    >>> error = TooManyBadRecords(RecordError(9, 1, ValueError("bad JPEG")), "3 in epoch 1")
    >>> str(error), error.index, error.__cause__
    ('record 9 (epoch 1) failed: ValueError: bad JPEG; 3 in epoch 1', 9, ValueError('bad JPEG'))
    """

    def __init__(self, error: RecordError, problem: str) -> None:
        cause = error.__cause__ if error.__cause__ is not None else error
        super().__init__(error.index, error.epoch, cause)
        self.args = (f"{error}; {problem}",)


class PoisonedRecords(RecordError):
    """Work that killed the process loading it on a worker, or never finished, on every worker
    that was asked (two by default): one or more of its records (`indices`, of `epochs`; at
    `rows` of the batch) is poison. `index` and `epoch` are the first of them; the cause holds the
    last reason.

    >>> from loadax.errors import PoisonedRecords
    >>> error = PoisonedRecords(
    ...     "the batch of step 3", [0, 1], [17, 4], [0, 0], "exited with code 3", ["a:1", "b:1"]
    ... )
    >>> str(error).split(": records")[0]
    'the batch of step 3 killed or stalled what loaded it, at each of 2 attempts (a:1, b:1)'
    >>> error.indices, error.rows, error.index, error.reason
    ([17, 4], [0, 1], 17, 'exited with code 3')
    """

    def __init__(
        self,
        work: str,
        rows: Sequence[int],
        indices: Sequence[int],
        epochs: Sequence[int],
        reason: str,
        workers: Sequence[str],
    ) -> None:
        cause = RemoteCause("PoisonedWork", reason)
        RuntimeError.__init__(
            self,
            f"{work} killed or stalled what loaded it, at each of {len(workers)} attempts "
            f"({', '.join(workers)}): records {listed(indices)} (epochs {listed(epochs)}) at "
            f"rows {listed(rows)}; last: {reason}",
        )
        self.index = int(indices[0]) if len(indices) else -1
        self.epoch = int(epochs[0]) if len(epochs) else -1
        self.__cause__ = cause
        self.work, self.reason, self.workers = work, reason, list(workers)
        self.rows, self.indices, self.epochs = list(rows), list(indices), list(epochs)


def listed(values: Sequence[int], most: int = 16) -> str:
    """`values` as a list, the first `most` of them when there are more (for messages)."""
    shown = ", ".join(str(int(value)) for value in values[:most])
    more = f", ... ({len(values)} in all)" if len(values) > most else ""
    return f"[{shown}{more}]"


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
