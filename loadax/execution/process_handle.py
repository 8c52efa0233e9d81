"""The parent's side of one loader process: the process, the pipe to it, the task it loads and
the shared memory segment it writes batches into.

A segment keeps its /dev/shm name only until the process has attached to it, so none is left
behind, even when a process is killed.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from loadax.buffers import BufferPool
from loadax.execution.process_child import ChildRequest, segment_view
from loadax.execution.process_errors import WorkerProcessError


@dataclasses.dataclass(eq=False)
class Task:
    """A work item on its way through the executor, and the future its result settles."""

    request: ChildRequest
    future: Future[Any] = dataclasses.field(default_factory=Future)
    started: float = 0.0  # when a process took it (time.monotonic())
    owner: object = None  # who submitted it, for `ProcessExecutor.cancel_queued`


class LoaderProcess:
    """A loader process, the pipe to it, its task (one at a time) and its shared memory."""

    def __init__(self, slot: int, process: BaseProcess, connection: Connection) -> None:
        self.slot, self.process, self.connection = slot, process, connection
        self.task: Task | None = None
        self.collector: threading.Thread | None = None
        self.loaded = 0  # work items it has loaded
        self.stopped_for: str | None = None  # why the parent killed it, when it did
        self._segment: SharedMemory | None = None
        self._named = False  # the segment's name is still in /dev/shm

    def __str__(self) -> str:
        return f"loader process {self.slot} (pid {self.process.pid})"

    def new_segment(self, size: int) -> str:
        """Make a segment of at least `size` bytes in place of the current one; its name."""
        capacity = max(size, 2 * self._segment.size) if self._segment is not None else size
        while True:
            try:
                segment = SharedMemory(
                    f"loadax{os.getpid()}_{secrets.token_hex(4)}", create=True, size=capacity
                )
            except FileExistsError:
                continue
            break
        self.drop_segment()
        self._segment, self._named = segment, True
        return segment.name

    def copy_out(self, size: int, buffers: BufferPool) -> memoryview:
        """The first `size` bytes of the segment, in a buffer of `buffers` (reused once nothing
        made from it is alive); the process has attached, so unlink its name."""
        if self._segment is None:
            raise WorkerProcessError(f"{self} wrote a batch without a shared memory segment")
        self._unlink()
        copied = buffers.take(size)
        copied[:] = segment_view(self._segment)[:size]
        return copied

    def drop_segment(self) -> None:
        self._unlink()
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def _unlink(self) -> None:
        if self._named and self._segment is not None:
            self._segment.unlink()
            self._named = False


def kill_running(processes: list[LoaderProcess]) -> None:
    """Kill those of `processes` still running (the parent owns the segments)."""
    for process in processes:
        if process.process.is_alive():
            process.process.kill()


def exit_reason(code: int | None) -> str:
    """What an exit code says happened to a process."""
    if code is None or code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name
    if -code == signal.SIGBUS:
        return f"was killed by {name}: /dev/shm may be too small for its batches"
    return f"was killed by {name}"
