"""The C heap of a process that loads batches: memory freed by one batch kept for the next, not
handed back.

A batch's records are arrays of a few hundred KiB to a few MiB (R1: 64 crops of 600 KiB, and the
rows read for them), allocated by the loading threads and freed together once the batch is
stacked. glibc trims a heap whose free top exceeds its trim threshold (twice the largest block it
has mapped and freed, a few MiB), so each batch's records gave their memory back to the kernel
and the next batch's faulted it in again, page by page: a third of an R1 worker's CPU
(`asm_exc_page_fault` 33 % of its samples, the C heap's `madvise` 4 %), and in a local loader's
process 180 faults an image of W4 (a decoded JPEG and its 600 KiB crop), 0.3-0.5 ms of its
1.2-1.8 ms, where webdataset's process took 15. A worker and a loader process serve batch after
batch, so they keep what they freed: the heap stays at its peak, the records of the batches
loading at once, which the memory budget leaves room for (`Worker`). A local loader keeps it in
the trainer's process too, leaving the number of heaps to the trainer's other threads.
"""

from __future__ import annotations

import ctypes
import platform

MMAP_THRESHOLD = 32 << 20
"""Blocks below this come from the heap, not from a mapping of their own (glibc's own ceiling for
the threshold it adjusts itself; setting the trim threshold stops that adjustment)."""
TRIM_THRESHOLD = 256 << 20
"""How much free memory a heap keeps at its top before glibc gives it back. A thread's heap is at
most 64 MiB, so the loading threads' heaps are never trimmed; the main heap is, above this."""
ARENAS = 1
"""The heaps of a process that loads on one thread (a loader's child process): the main one."""


def loading_arenas(threads: int, cores: int) -> int:
    """The heaps of a process whose `threads` load records on `cores`: one for each loading
    thread that can run at once, and the main heap for the other threads.

    A loading thread then reuses the blocks it freed itself (likely still in its core's cache),
    not blocks that another core wrote last: a W3 worker (FFTs of 1-2 MiB blocks) whose threads
    all shared one heap spent 5-8 % more CPU on the same records (`benchmarks/PROFILES.md`). No more
    heaps than cores: each keeps its own peak, and threads that take turns on the cores would
    each keep one; 16 loading threads on 2 cores raised a worker's peak RSS by 59 MiB with a
    heap each (glibc's default, up to 8 per core), 21 MiB with 3 and 13 MiB with one
    (`tests/test_load.py`).

    >>> loading_arenas(threads=4, cores=2), loading_arenas(threads=2, cores=64)
    (3, 3)
    """
    return min(threads, cores) + 1


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def keep_freed_memory(arenas: int | None = ARENAS) -> bool:
    """Set this process's glibc heap to keep freed memory (`MMAP_THRESHOLD`, `TRIM_THRESHOLD`,
    in `arenas` heaps; None: as many as glibc makes): whether it did (False on a C library other
    than glibc, which has its own policy)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        and (arenas is None or mallopt(_M_ARENA_MAX, arenas))
    )
