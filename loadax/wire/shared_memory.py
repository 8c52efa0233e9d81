"""Batches through shared memory between a client and a worker on one host: the worker writes a
payload into a memory file of the client (a memfd) instead of sending it, and the client decodes
it in place, without a socket copy on either side.

The client owns the memory: it makes the files (`os.memfd_create`, named "loadax-" and a random
name), maps them, and names one in each request it sends to a worker of its host
(`wire.SharedMemory`: its pid, the file's descriptor there, its name). The worker opens the file
through `/proc/<pid>/fd/<fd>`, checks that it is the memfd of that name (a descriptor closed and
reused is never taken for it), and maps it (`ClientFile`): the loading threads stack the batch
straight into it, at the places its encoding gives the arrays, so that its bytes are written
once, and hash each chunk of the payload they complete while it is in their cache (for XXH3 in
chunks: `loadax.wire.stacked_payload`, as a batch for a socket is stacked in the worker); then
the payload's other bytes (its header, the padding) are written and the rest is checksummed.
A batch made elsewhere (by a child process, or for another request) is copied in whole: written
(`pwrite`) into a file the worker has not used lately, whose pages a mapping would have zeroed
first, else copied into its mapping. The worker then closes the file, but keeps its mapping for
the next batches it carries (`Mappings`), for `KEPT_FOR_S` after its last use. A memfd has no
name in any file system, so nothing is left behind when either process ends, however it ends
(kill -9 included): its memory goes with the last descriptor and mapping, the worker's within
`KEPT_FOR_S`.

Same host, and allowed: the client's handshake carries its host's boot id (`host_id`) and a file
to open (`wire.HandshakeRequest.probe`); the worker answers `shared_memory` when both match and
it could open the file (which takes the same user, or ptrace rights, and the same pid namespace).
The reply is verified as any other: the client checksums the bytes in its file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import mmap
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadax.wire.checksum import ChunkDigests, Hasher, new_hasher
from loadax.wire.limits import MAX_BATCH_BYTES
from loadax.wire.stacked_payload import PIECE_BYTES, StackedPayload
from loadax.wire.v1 import worker_pb2 as wire

PREFIX = "loadax-"
"""How the name of every memory file of loadax starts."""
_NAME = re.compile(r"[0-9a-f]{16,64}")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class SharedMemoryError(OSError):
    """A client's memory file that this process cannot use, and why."""


def host_id() -> str:
    """This host's identity for as long as it runs (its boot id); '' where there is none, which
    matches no host.

    >>> from loadax.wire.shared_memory import host_id
    >>> len(host_id()) in (0, 36)
    True
    """
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def open_client_file(memory: wire.SharedMemory) -> int:
    """A descriptor of the memory file `memory` names, open to map and write (close it); a
    `SharedMemoryError` saying why not (another host or pid namespace, another user, a closed
    descriptor, or one that is not that file), or if the file could shrink: it must be sealed
    against it (`F_SEAL_SHRINK`, for good), as a mapping's pages past a shrunk file's end would
    crash the worker that writes them (SIGBUS)."""
    if not _NAME.fullmatch(memory.name):
        raise SharedMemoryError(f"{memory.name[:80]!r} is not the name of a loadax memory file")
    expected = f"/memfd:{PREFIX}{memory.name} (deleted)"
    path = f"/proc/{memory.pid}/fd/{memory.fd}"
    try:
        if os.readlink(path) != expected:
            raise SharedMemoryError(f"{path} is not the memory file {PREFIX}{memory.name}")
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except SharedMemoryError:
        raise
    except OSError as error:
        raise SharedMemoryError(f"cannot open {path}: {error.strerror}") from None
    # The descriptor could have been replaced between the check and the open: check what opened.
    if os.readlink(f"/proc/self/fd/{fd}") != expected:
        os.close(fd)
        raise SharedMemoryError(f"{path} changed while it was opened")
    if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
        os.close(fd)
        raise SharedMemoryError(f"{path} is not sealed against shrinking (F_SEAL_SHRINK)")
    return fd


def can_open(memory: wire.SharedMemory) -> bool:
    """Whether this process can open the client's memory file `memory` (a handshake's probe)."""
    try:
        os.close(open_client_file(memory))
    except SharedMemoryError:
        return False
    return True


KEPT_MAPPINGS = 16
"""How many clients' memory files a worker keeps mapped between requests (`Mappings`)."""
KEPT_FOR_S = 2.0
"""How long a worker keeps a client's memory file mapped after its last request: a client
gone (kill -9 included) has its memory let go of that long after at most."""


@dataclasses.dataclass(eq=False, slots=True)
class _Mapping:
    """A mapping of a client's memory file (None: written, not mapped yet), the file's identity
    (device, inode) and when it was last used."""

    data: np.ndarray[Any, np.dtype[np.uint8]] | None
    identity: tuple[int, int]
    used: float = 0.0


class Mappings:
    """A worker's mappings of its clients' memory files, kept between requests: at most `kept`,
    each for `kept_for_s` after its last use. Mapping a file with its pages at once
    (`MAP_POPULATE`) and unmapping it cost about what writing it does: 8 MiB to 38 MB mapped,
    copied into and unmapped took 0.24-0.29 s/GB here, a `pwrite` 0.29-0.31, a copy into a
    mapping kept 0.06-0.12. Kept, a file is mapped once for all the batches it carries. Which
    file a request names is checked anew each time (`open_client_file`), and a mapping is
    reused only for the file opened then (the same inode).

    A file is mapped the second time it is used lately (`first_use`), not the first: a client
    allocates its files (`posix_fallocate`), and tmpfs zeroes such pages at their first touch
    through a mapping, but not when a write fills them. An 8 MiB file fresh from the client:
    mapped (with its pages) and copied into 4.3-5.1 ms here, written with `pwrite` 1.5-2.2 ms;
    one the worker grows from nothing 6.0-6.6 ms against 3.1-3.8. Mapped again once written,
    with its pages: 0.9-1.1 ms.
    """

    def __init__(self, kept: int = KEPT_MAPPINGS, kept_for_s: float = KEPT_FOR_S) -> None:
        self._kept, self._kept_for_s = kept, kept_for_s
        self._lock = threading.Lock()
        self._aged = threading.Condition(self._lock)
        self._mappings: OrderedDict[tuple[int, int, str], _Mapping] = OrderedDict()
        self._dropping = False  # a thread drops those kept past `kept_for_s`

    def first_use(self, memory: wire.SharedMemory, fd: int) -> bool:
        """Whether the memory file `memory` names, open as `fd`, is used here for the first time
        lately (then it is not mapped: write it with `pwrite`); the next use maps it."""
        key, identity = _key(memory), _identity(os.fstat(fd))
        with self._lock:
            mapping = self._mappings.pop(key, None)
        if mapping is None or mapping.identity != identity:
            self._keep(key, _Mapping(None, identity))
            return True
        self._keep(key, mapping)
        return False

    def mapped(
        self, memory: wire.SharedMemory, fd: int, size: int
    ) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """All of the memory file `memory` names, open as `fd`, mapped (at least `size` bytes:
        grown to them if shorter); an OSError if it cannot be grown or mapped."""
        key = _key(memory)
        status = os.fstat(fd)
        identity = _identity(status)
        with self._lock:
            mapping = self._mappings.pop(key, None)
        data = None if mapping is None or mapping.identity != identity else mapping.data
        if data is None or len(data) < size:
            if status.st_size < size:
                os.posix_fallocate(fd, 0, size)
            length = max(size, status.st_size)
            flags = mmap.MAP_SHARED | mmap.MAP_POPULATE  # its pages at once, not 4 KiB faults
            data = np.frombuffer(mmap.mmap(fd, length, flags=flags), np.uint8)
        self._keep(key, _Mapping(data, identity))
        return data

    def _keep(self, key: tuple[int, int, str], mapping: _Mapping) -> None:
        """Keep `mapping` as the latest used, within `kept`, and drop it `kept_for_s` after."""
        with self._lock:
            mapping.used = time.monotonic()
            self._mappings[key] = mapping
            while len(self._mappings) > self._kept:
                self._mappings.popitem(last=False)
            if self._mappings and not self._dropping:
                self._dropping = True
                threading.Thread(
                    target=self._drop_aged, name="loadax-mappings", daemon=True
                ).start()

    def _drop_aged(self) -> None:
        """Drop each mapping once it has not been used for `kept_for_s`, while any is kept."""
        with self._lock:
            while self._mappings:
                # The least recently used; not held while waiting, so that a mapping evicted
                # meanwhile is unmapped at once.
                used = next(iter(self._mappings.values())).used
                left = used + self._kept_for_s - time.monotonic()
                if left > 0:
                    self._aged.wait(left)
                else:
                    self._mappings.popitem(last=False)
            self._dropping = False


def _key(memory: wire.SharedMemory) -> tuple[int, int, str]:
    return (memory.pid, memory.fd, memory.name)


def _identity(status: os.stat_result) -> tuple[int, int]:
    return (status.st_dev, status.st_ino)


class ClientFile(StackedPayload):
    """The memory file `memory` names, open for one request (`close` it) and mapped through
    `mappings` (by default, kept for this request alone): a batch may be stacked into it
    (a `StackedPayload`, its chunks hashed as stacked with `checksum` XXH3 in chunks, the kind
    the request's reply carries), and the payload is `write`n into it, of at most `max_bytes`.
    A `SharedMemoryError` if it cannot be opened."""

    def __init__(
        self,
        memory: wire.SharedMemory,
        max_bytes: int = MAX_BATCH_BYTES,
        mappings: Mappings | None = None,
        checksum: int = wire.CHECKSUM_WEIGHTED_SUM,
    ) -> None:
        super().__init__(max_bytes, checksum)
        self.name = f"{PREFIX}{memory.name}"
        self._memory = memory
        self._fd = open_client_file(memory)
        self._mappings = mappings or Mappings(kept=0)

    def write(
        self, frames: Sequence[bytes | memoryview], checksum: int | None = None
    ) -> tuple[int, int | None]:
        """Copy the payload `frames` make into the file from its start, but for the frames
        already in place (stacked there by `leaves`), and compute its checksum of the kind
        `checksum` (None: none) where the bytes are in the CPU's cache: each piece of at most
        `PIECE_BYTES` just before it is copied, or for XXH3 in chunks, each chunk as it is
        complete (those that stacking completed were hashed then): how many bytes, and the
        checksum. A file used here for the first time lately (`Mappings.first_use`) is not
        mapped: each piece is written with `pwrite`. A `SharedMemoryError` if it cannot be
        written (e.g. its client is gone)."""
        placed = self._placed(frames)
        if self._data is None and self._mappings.first_use(self._memory, self._fd):
            return placed.size, self._pwritten(placed.views, checksum)
        try:
            data = self._mapped(placed.size)
        except OSError as error:
            raise SharedMemoryError(f"cannot write {self.name}: {error.strerror}") from None
        hasher: Hasher | None = None
        chunks = self._stacked_chunks(placed)
        if checksum == wire.CHECKSUM_XXH3_CHUNKS:
            chunks = chunks or ChunkDigests(data, placed.size)
        else:
            hasher, chunks = None if checksum is None else new_hasher(checksum), None
        self._copy(placed, data, hasher, chunks)
        summed = hasher or chunks
        return placed.size, None if summed is None else summed.value()

    def _pwritten(self, views: list[memoryview], checksum: int | None) -> int | None:
        """Write `views` one after another from the file's start with `pwrite`, each piece of at
        most `PIECE_BYTES` hashed just before (checksum `checksum`, None: none): the checksum."""
        hasher = None if checksum is None else new_hasher(checksum)
        at = 0
        try:
            for view in views:
                for offset in range(0, len(view), PIECE_BYTES):
                    piece = view[offset : offset + PIECE_BYTES]
                    if hasher is not None:
                        hasher.update(piece)
                    while piece:
                        written = os.pwrite(self._fd, piece, at)
                        piece, at = piece[written:], at + written
        except OSError as error:
            raise SharedMemoryError(f"cannot write {self.name}: {error.strerror}") from None
        return None if hasher is None else hasher.value()

    def _allocate(self, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return self._mappings.mapped(self._memory, self._fd, size)

    def close(self) -> None:
        """Close its descriptor; its mapping goes with the batch stacked into it, unless its
        `mappings` keep it."""
        os.close(self._fd)
