"""The client's end of batches through shared memory (`loadax.wire.shared_memory`): the memory
files a same-host worker writes payloads into, each mapped once and reused, and when each may be
written again.

A loader's transports share one `MemoryFiles` (as they share one `BufferPool`), so that they
keep their spare files between them; a process has one file that handshakes name (`PROBE`),
whatever its fleet. A file is lent to one request at a time. It comes back once its request is
answered (the worker wrote it before it answered) and is reused when nothing decoded from it is
alive, as the buffers of `loadax.buffers.BufferPool` are. A request that ends without an answer
(cancelled, its connection lost) may still be written by its worker: its file is dropped, never
lent again, so that no late write reaches a batch that was checked already.

Files are kept for as many batches as were lent or alive at once lately, and one spare: a new
file costs far more than a reused one (the worker maps it and its first touch zeroes its pages:
8-10 % of a same-host worker's samples at 8 MiB batches when only one free file was kept, and
a file made every 3-4 batches, as the batches alive went from 2 to 3 and back).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import sys
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadax.client.transports.reply import Buffer, Reply
from loadax.client.transports.shared import Shared
from loadax.errors import WorkerError
from loadax.wire.failures import BAD_REPLY
from loadax.wire.shared_memory import PREFIX, host_id
from loadax.wire.v1 import worker_pb2 as wire


class MemoryFile:
    """One memory file of this process (a memfd), and its mapping; its first `size` bytes are
    allocated here, so that this process's memory (its cgroup's) holds them, not the worker's
    that writes them first (tmpfs pages count where they are first allocated). It is sealed
    against shrinking, as a worker requires of a file it maps (`open_client_file`)."""

    def __init__(self, size: int = 0) -> None:
        self.name = secrets.token_hex(8)
        self.fd = os.memfd_create(PREFIX + self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        if size:
            os.posix_fallocate(self.fd, 0, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        self._array: np.ndarray[Any, np.dtype[np.uint8]] | None = None

    @property
    def wire(self) -> wire.SharedMemory:
        """How a request names it to a worker."""
        return wire.SharedMemory(pid=os.getpid(), fd=self.fd, name=self.name)

    def payload(self, size: int) -> memoryview:
        """A read-only view of its first `size` bytes, which keeps the mapping alive; a
        ValueError if the file is shorter (the worker did not write them, and a mapping past
        its end would fault). Whether the bytes are the batch is the reply's checksum's to say."""
        length = os.fstat(self.fd).st_size
        if length < size:
            raise ValueError(f"its memory file holds {length} bytes, fewer than {size}")
        if self._array is None or len(self._array) < size:
            # Mapped again only when it grew, and only while nothing decoded from it is alive
            # (a file is lent when free), so the mapping's pages are faulted in once.
            populated = mmap.mmap(
                self.fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
            )
            self._array = np.frombuffer(populated, np.uint8)
        return self._array[:size].data

    def in_use(self) -> bool:
        """Whether anything made from one of its payloads is alive."""
        return self._array is not None and _references(self) > _FREE

    def close(self) -> None:
        """Close its descriptor; its mapping goes once nothing made from it is alive."""
        self._array = None
        os.close(self.fd)


def _references(file: MemoryFile) -> int:
    """The reference count of the array of `file`'s mapping, as `in_use` sees it."""
    return sys.getrefcount(file._array)


def _free_count() -> int:
    """What `_references` counts of a file's array that nothing else refers to."""
    file = MemoryFile.__new__(MemoryFile)
    file._array = np.empty(0, np.uint8)
    return _references(file)


_FREE = _free_count()


PROBE: Shared[MemoryFile] = Shared(MemoryFile, MemoryFile.close)
"""The file of this process that handshakes name for a worker to try (it is never written)."""


def same_host_handshake(request: wire.HandshakeRequest, probe: MemoryFile) -> wire.HandshakeRequest:
    """`request` with this host and `probe`, for a worker to say whether it can write into this
    process's memory files."""
    asked = wire.HandshakeRequest()
    asked.CopyFrom(request)
    asked.host = host_id()
    asked.probe.CopyFrom(probe.wire)
    return asked


RECENT_LENDS = 16
"""How many of the latest lends `MemoryFiles` remembers the files needed at (lent or alive)."""


class MemoryFiles:
    """The memory files of a loader's transports: `lend` one to a request (`Lease`), `settle` it
    when the request ends. Free files are kept while all the files together are no more than
    the most that were lent or alive at once at one of the latest `recent` lends, plus `spare`:
    a steady stream reuses the same files, and the memory held follows what the loader and its
    user hold (within base + (in flight + 2) x batch bytes, as the receive buffers)."""

    def __init__(self, spare: int = 1, recent: int = RECENT_LENDS) -> None:
        self._spare = spare
        self._lock = threading.Lock()
        self._answered: list[MemoryFile] = []  # not lent: in use, or free
        self._lent = 0
        self._needed: deque[int] = deque(maxlen=recent)  # files lent or alive at each lend
        self._closed = False
        self._largest = 0  # the largest payload written into one of its files

    def lend(self) -> MemoryFile:
        """A free file (or a new one), lent until it is `settle`d."""
        with self._lock:
            self._lent += 1
            free = [file for file in self._answered if not file.in_use()]
            self._needed.append(self._lent + len(self._answered) - len(free))
            if free:
                self._answered.remove(free[0])
                return free[0]
            largest = self._largest
        return MemoryFile(largest)

    def written(self, size: int) -> None:
        """A worker wrote a payload of `size` bytes into one of its files: new files are
        allocated that large."""
        with self._lock:
            self._largest = max(self._largest, size)

    def settle(self, file: MemoryFile, answered: bool) -> None:
        """The end of the request `file` was lent to: kept for reuse if the worker `answered`,
        closed otherwise (or if more files would be kept than lately needed, and `spare`)."""
        with self._lock:
            self._lent -= 1
            if answered and not self._closed:
                self._answered.append(file)
                free = [kept for kept in self._answered if not kept.in_use()]
                needed = max(self._needed, default=0) + self._spare
                extra = free[: max(0, self._lent + len(self._answered) - needed)]
                self._answered = [kept for kept in self._answered if kept not in extra]
            else:
                extra = [file]
        for closing in extra:
            closing.close()

    @property
    def kept(self) -> int:
        """How many files are kept (not lent)."""
        with self._lock:
            return len(self._answered)

    def close(self) -> None:
        """Close every file not lent; those lent are closed as they are settled."""
        with self._lock:
            self._closed = True
            files, self._answered = self._answered, []
        for file in files:
            file.close()


class Lease:
    """A file of `files` lent to one batch request, `request` as it names it; `settle` it once
    the request's future is done. A transport makes its reply with `reply`."""

    def __init__(self, files: MemoryFiles, request: wire.BatchRequest) -> None:
        self._files = files
        self._file = files.lend()
        self._answered = False
        self.request = wire.BatchRequest()
        self.request.CopyFrom(request)
        self.request.shared_memory.CopyFrom(self._file.wire)

    def reply(
        self,
        worker: str,
        header: wire.BatchResponse,
        payload: Sequence[Buffer],
        checksum: int | None,
        max_bytes: int,
    ) -> Reply:
        """The reply the worker answered with `header` (and `payload`, if it sent it rather than
        write it into the file: e.g. it could not open it); the file's part refused beyond
        `max_bytes` (BAD_REPLY)."""
        self._answered = True  # it wrote the file before it answered, and is done with it
        if not header.shared_memory:
            return Reply(header, payload, checksum)
        if header.payload_size > max_bytes:
            raise WorkerError(
                BAD_REPLY,
                f"{worker} declares a payload of {header.payload_size} bytes in shared memory, "
                f"more than {max_bytes}",
            )
        try:
            in_file = self._file.payload(header.payload_size)
        except ValueError as error:
            raise WorkerError(BAD_REPLY, f"{worker} sent a batch reply: {error}") from None
        self._files.written(header.payload_size)
        return Reply(header, [in_file])

    def settle(self, _: object = None) -> None:
        """The request is over: the file is reused if the worker answered, dropped if not."""
        self._files.settle(self._file, self._answered)


class SameHostFiles:
    """What one worker's transport knows of shared memory: whether to offer it (`enabled`),
    whether the worker's handshake took it, and the files to lend (`files`, by default a pool
    of its own, closed with it)."""

    def __init__(self, enabled: bool, files: MemoryFiles | None) -> None:
        self._probe = PROBE.acquire() if enabled else None
        self._owned = files is None
        self._files = files or MemoryFiles()
        self._taken = False

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeRequest:
        """`request` as sent: offering shared memory, if enabled."""
        return request if self._probe is None else same_host_handshake(request, self._probe)

    def learn(self, response: wire.HandshakeResponse) -> None:
        """The worker's handshake `response`: from one that can write into this process's
        files, every batch is asked that way."""
        self._taken = self._taken or (self._probe is not None and response.shared_memory)

    @property
    def taken(self) -> bool:
        """Whether the worker's handshake took shared memory: it writes batches into files."""
        return self._taken

    def lease(self, request: wire.BatchRequest) -> Lease | None:
        """A file lent to `request` (`Lease.request` to send), None if the worker does not
        write into them."""
        return Lease(self._files, request) if self.taken else None

    def close(self) -> None:
        if self._probe is not None:
            PROBE.release(self._probe)
            self._probe = None
        if self._owned:
            self._files.close()
