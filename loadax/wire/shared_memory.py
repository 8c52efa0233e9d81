"""Batches through shared memory between a client and a worker on one host: the worker writes a
payload into a memory file of the client (a memfd) instead of sending it, and the client decodes
it in place, without a socket copy on either side.

The client owns the memory: it makes the files (`os.memfd_create`, named "loadax-" and a random
name), maps them, and names one in each request it sends to a worker of its host
(`wire.SharedMemory`: its pid, the file's descriptor there, its name). The worker opens the file
through `/proc/<pid>/fd/<fd>`, checks that it is the memfd of that name (a descriptor closed and
reused is never taken for it), writes the payload from its start and closes it again: it holds
nothing of a client between requests. A memfd has no name in any file system, so nothing is left
behind when either process ends, however it ends (kill -9 included): its memory goes with the
last descriptor and mapping.

Same host, and allowed: the client's handshake carries its host's boot id (`host_id`) and a file
to open (`wire.HandshakeRequest.probe`); the worker answers `shared_memory` when both match and
it could open the file (which takes the same user, or ptrace rights, and the same pid namespace).
The reply is verified as any other: the client checksums the bytes in its file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from loadax.wire.checksum import Hasher
from loadax.wire.v1 import worker_pb2 as wire

PREFIX = "loadax-"
"""How the name of every memory file of loadax starts."""
PIECE_BYTES = 1 << 20
"""A payload is written in pieces of at most this many bytes (one `os.pwrite` each)."""
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
    """A descriptor of the memory file `memory` names, open for writing (close it); a
    `SharedMemoryError` saying why not (another host or pid namespace, another user, a closed
    descriptor, or one that is not that file)."""
    if not _NAME.fullmatch(memory.name):
        raise SharedMemoryError(f"{memory.name[:80]!r} is not the name of a loadax memory file")
    expected = f"/memfd:{PREFIX}{memory.name} (deleted)"
    path = f"/proc/{memory.pid}/fd/{memory.fd}"
    try:
        if os.readlink(path) != expected:
            raise SharedMemoryError(f"{path} is not the memory file {PREFIX}{memory.name}")
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except SharedMemoryError:
        raise
    except OSError as error:
        raise SharedMemoryError(f"cannot open {path}: {error.strerror}") from None
    # The descriptor could have been replaced between the check and the open: check what opened.
    if os.readlink(f"/proc/self/fd/{fd}") != expected:
        os.close(fd)
        raise SharedMemoryError(f"{path} changed while it was opened")
    return fd


def can_open(memory: wire.SharedMemory) -> bool:
    """Whether this process can open the client's memory file `memory` (a handshake's probe)."""
    try:
        os.close(open_client_file(memory))
    except SharedMemoryError:
        return False
    return True


def write_payload(
    memory: wire.SharedMemory, frames: Sequence[bytes | memoryview], hasher: Hasher | None = None
) -> int:
    """Write `frames`, one after the other, into the client's memory file `memory` from its
    start, each piece given to `hasher` too (if any) just before it is written, so that the
    write finds it in the CPU's cache: how many bytes. A `SharedMemoryError` if it cannot be
    opened or written (e.g. its client is gone)."""
    fd = open_client_file(memory)
    try:
        offset = 0
        for frame in frames:
            view = memoryview(frame).cast("B")
            for start in range(0, len(view), PIECE_BYTES):
                piece = view[start : start + PIECE_BYTES]
                if hasher is not None:
                    hasher.update(piece)
                while piece:  # a write may take less than it is given
                    written = os.pwrite(fd, piece, offset)
                    piece, offset = piece[written:], offset + written
        return offset
    except OSError as error:
        raise SharedMemoryError(f"cannot write {PREFIX}{memory.name}: {error.strerror}") from None
    finally:
        os.close(fd)
