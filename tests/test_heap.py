"""A loading process's C heap keeps what it freed (loadax.execution.heap)."""

from __future__ import annotations

import doctest
import subprocess
import sys

from loadax.execution import heap

# Rounds of 300 blocks of 100 KB, each round freed before the next: each round's page faults.
# The module is loaded from its file, so that the process starts without importing jax.
ROUNDS = """
import importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("heap", sys.argv[1])
heap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heap)
if sys.argv[2] == "keep":
    assert heap.keep_freed_memory()
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [bytearray(100_000) for _ in range(300)]
    del blocks
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_per_round(policy: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", ROUNDS, heap.__file__, policy],
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(line) for line in done.stdout.split()]


def test_memory_freed_by_one_batch_serves_the_next_without_faulting_it_in_again() -> None:
    # 30 MB freed at the top of the heap: glibc gives it back by default, so that every round
    # faults its pages in again; the worker's heap keeps it.
    first, *later = faults_per_round("keep")
    assert first > 2000
    assert max(later) < 100, later
    assert min(faults_per_round("default")[1:]) > 2000


def test_a_loading_process_has_a_heap_per_loading_thread_that_can_run_at_once() -> None:
    assert doctest.testmod(heap).failed == 0
