"""What a loader process runs: it loads the work items the parent sends, and writes each batch,
encoded by `loadax.wire.codec`, into a shared memory segment the parent made for it.

Only sizes and segment names cross the pipe; arrays are never pickled. An error comes back as a
`ChildError`, with the child's traceback, and is rebuilt as the exception it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import signal
import traceback
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import jax

from loadax.errors import RecordError
from loadax.execution.heap import keep_freed_memory
from loadax.execution.process_errors import ChildRaised
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.codec import CodecError, encode_frames


@dataclasses.dataclass(frozen=True, slots=True)
class ChildRequest:
    """What the parent sends a process: one work item of a plan."""

    plan: Plan
    work: Work

    def __str__(self) -> str:
        return str(self.work)


@dataclasses.dataclass(frozen=True, slots=True)
class ChildError:
    """An exception raised in a loader process, as the parent rebuilds it."""

    traceback: str
    type_name: str  # of the error (of the cause, for a record's error)
    message: str
    pickled: bytes | None  # the error (the cause), when it survives pickling
    record: tuple[int, int] | None  # (index, epoch) of a RecordError

    @classmethod
    def of(cls, error: Exception) -> ChildError:
        text = "".join(traceback.format_exception(error))
        record = None
        if isinstance(error, RecordError) and isinstance(error.__cause__, Exception):
            record, error = (error.index, error.epoch), error.__cause__
        return cls(text, type(error).__name__, str(error), _pickled(error), record)

    def rebuild(self, where: str) -> Exception:
        error: Exception = ChildRaised(self.type_name, self.message)
        if self.pickled is not None:
            with contextlib.suppress(Exception):
                error = pickle.loads(self.pickled)
        if self.record is not None:
            cause = error
            error = RecordError(*self.record, cause)
            error.__cause__ = cause
        error.add_note(f"loadax: raised in {where}; the traceback there:\n{self.traceback}")
        return error


def _pickled(error: Exception) -> bytes | None:
    """`error` pickled, if unpickling gives it back (a custom __init__ may not allow that)."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
    except Exception:
        return None
    return data


def serve(connection: Connection, pipeline_data: bytes) -> None:
    """A loader process: load what the parent asks for, until the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    # A transform that uses JAX must not take the trainer's accelerators (nor their memory).
    jax.config.update("jax_platforms", "cpu")  # type: ignore[no-untyped-call]
    keep_freed_memory()  # it loads batch after batch, as a worker does
    try:
        pipeline = pickle.loads(pipeline_data)
    except Exception:
        connection.send(("broken", traceback.format_exc()))
        return
    segment: SharedMemory | None = None
    with contextlib.suppress(EOFError, BrokenPipeError):  # the parent has gone
        while True:
            request: ChildRequest | None = connection.recv()
            if request is None:  # released: exit normally, running the process's finalizers
                return
            try:
                frames = _encoded(pipeline.run(request.plan, request.work))
            except Exception as error:
                connection.send(("failed", ChildError.of(error)))
                continue
            size = sum(len(frame) for frame in frames)
            if segment is None or segment.size < size:
                connection.send(("grow", size))
                if segment is not None:
                    segment.close()
                name: str | None = connection.recv()
                if name is None:  # released while it waited for room: exit as above
                    return
                segment = SharedMemory(name)
            view, offset = segment_view(segment), 0
            for frame in frames:  # each array's bytes copied once, straight into the segment
                view[offset : offset + len(frame)] = frame
                offset += len(frame)
            connection.send(("done", size))


def segment_view(segment: SharedMemory) -> memoryview:
    """The bytes of `segment`; a ValueError once it is closed."""
    view = segment.buf
    if view is None:
        raise ValueError(f"shared memory segment {segment.name} is closed")
    return view


def _encoded(batch: Any) -> list[bytes | memoryview]:
    try:
        return encode_frames(batch)
    except CodecError as error:
        error.add_note(
            "loadax: loader processes send batches with loadax.wire.codec: a batch must be dicts, "
            "lists and tuples of numpy arrays, numbers, str, bytes and None"
        )
        raise
