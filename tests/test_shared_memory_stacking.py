"""A same-host worker stacks a batch straight into its client's memory file (`ClientFile`), so
that its bytes are written once: the payload is the one it would send, and a batch in one
client's file reaches any other request only as a copy, as that client reuses its file."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pipelines
import pytest

import loadax
from loadax import Plan
from loadax.client.transports.memory_files import MemoryFile
from loadax.plan.work import StepWork
from loadax.server.memory import MemoryBudget
from loadax.server.same_host import SameHost
from loadax.server.share_cache import ShareCache
from loadax.server.worker import Worker
from loadax.wire import checksum, shared_memory
from loadax.wire.codec import encode_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import batch_request
from loadax.wire.v1 import worker_pb2 as wire

RECORDS, SIDE, BATCH = 24, 16, 4


@pytest.mark.parametrize(
    "kind", [wire.CHECKSUM_XXH3_CHUNKS, wire.CHECKSUM_XXH3_64, wire.CHECKSUM_WEIGHTED_SUM]
)
def test_a_batch_is_stacked_in_its_clients_file_as_the_payload_it_would_send(kind: int) -> None:
    # Older clients ask for the other kinds: the batch is stacked alike, checksummed as asked.
    worker = Worker({"images": pipelines.images(RECORDS, SIDE)}, threads=2, share_cache_bytes=0)
    file = MemoryFile()
    try:
        fingerprint = worker.info(wire.InfoRequest()).pipelines[0].fingerprint
        request = batch_request("images", fingerprint, Plan(RECORDS, BATCH), StepWork(1))
        request.checksum = kind  # type: ignore[assignment]
        request.shared_memory.CopyFrom(file.wire)
        sent = worker.load_batch(request)  # in the worker's memory, as a socket sends it
        same_host = SameHost(enabled=True)
        for _ in range(2):  # the file is grown to the payload, then reused
            with same_host.file(request) as into:
                built = worker.load_batch(request, checksummed=False, into=into)
                assert built.borrowed  # its arrays lie in the file
                placed = same_host.place(request, built, into)
            built.release()
            assert (placed.frames, placed.checksum) == ((), sent.checksum)
            assert placed.checksum_kind == sent.checksum_kind == kind
            assert bytes(file.payload(sent.size)) == sent.payload
        sent.release()
    finally:
        worker.close()
        file.close()


def mixed_dtypes(index: int) -> np.ndarray[Any, Any]:
    """Rows 0-1 of a batch of 4 int64, rows 2-3 uint64: its two parts stack differently, and
    each otherwise than the whole (float64), in as many bytes."""
    return np.full(200_000, index, np.int64 if index % 4 < 2 else np.uint64)


@pytest.mark.parametrize(
    ("pipeline", "hashed_by_loaders"),
    [
        (pipelines.images(8, 160), True),  # 4 rows of 300 KiB: chunks inside the images
        (loadax.Pipeline(loadax.RangeDataset(0, 8).map(mixed_dtypes), loadax.Batcher()), False),
    ],
)
def test_chunks_are_hashed_by_the_threads_that_stack_them_and_sum_as_sent(
    pipeline: loadax.Pipeline[Any, Any], hashed_by_loaders: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch whose parts do not stack alike (mixed dtypes) is stacked again elsewhere and
    # copied in: the chunks hashed as its first part was stacked are not the payload's. A batch
    # sent over a socket is stacked and hashed alike, in the worker's memory (`PooledPayload`).
    threads: list[str] = []
    digest = checksum._xxh3_digest
    monkeypatch.setattr(
        checksum,
        "_xxh3_digest",
        lambda data: threads.append(threading.current_thread().name) or digest(data),
    )
    worker = Worker({"p": pipeline}, threads=2, share_cache_bytes=0)
    file = MemoryFile()
    try:
        fingerprint = worker.info(wire.InfoRequest()).pipelines[0].fingerprint
        request = batch_request("p", fingerprint, Plan(8, 4), StepWork(1))
        assert request.checksum == wire.CHECKSUM_XXH3_CHUNKS
        request.shared_memory.CopyFrom(file.wire)
        threads.clear()
        sent = worker.load_batch(request)  # in the worker's memory, as a socket sends it
        assert sent.checksum == checksum.payload_checksum([sent.payload], request.checksum)
        if hashed_by_loaders:
            assert sum(name.startswith("loadax") for name in threads) >= 3
        threads.clear()
        same_host = SameHost(enabled=True)
        with same_host.file(request) as into:
            built = worker.load_batch(request, checksummed=False, into=into)
            placed = same_host.place(request, built, into)
        built.release()
        assert placed.checksum == sent.checksum
        assert bytes(file.payload(sent.size)) == sent.payload
        by_loaders = sum(name.startswith("loadax") for name in threads)
        assert by_loaders >= 3 if hashed_by_loaders else by_loaders > 0
        sent.release()
    finally:
        worker.close()
        file.close()


def test_a_batch_that_the_codec_lays_out_otherwise_is_not_stacked_in_the_file() -> None:
    file = MemoryFile()
    into = shared_memory.ClientFile(file.wire, max_bytes=1 << 10)
    try:
        tree = {"x": np.zeros((4, 2))}
        structure = jax.tree.structure(tree)
        assert into.leaves(structure, [((4, 300), np.dtype(np.float64))]) is None  # over 1 KiB
        assert into.leaves(structure, [((4,), np.dtype("O"))]) is None  # not encodable
        leaves = into.leaves(structure, [((4, 2), np.dtype(np.float64))])
        assert leaves is not None
        leaves[0][:] = np.arange(8.0).reshape(4, 2)
        frames = encode_frames({"x": leaves[0]})
        assert into.holds(frames)
        assert not into.holds(encode_frames(tree))
        assert into.write(frames) == (len(b"".join(frames)), None)
        expected = b"".join(encode_frames({"x": np.arange(8.0).reshape(4, 2)}))
        assert bytes(file.payload(len(expected))) == expected
        # Its rows encoded again after another leaf lie in the file, at another place.
        moved = {"a": np.ones(3), "x": leaves[0][1:]}
        expected = b"".join(encode_frames({key: leaf.copy() for key, leaf in moved.items()}))
        assert into.write(encode_frames(moved)) == (len(expected), None)
        assert bytes(file.payload(len(expected))) == expected
    finally:
        into.close()
        file.close()


def borrowed(payload: bytearray) -> Callable[[], EncodedBatch]:
    """A build of a batch whose payload lies in a client's file (`payload`)."""
    return lambda: EncodedBatch(0, [memoryview(payload)], borrowed=True)


def test_a_batch_in_one_clients_file_is_cached_as_a_copy() -> None:
    cache = ShareCache(MemoryBudget(1 << 20, wait_s=1.0), capacity=1 << 20)
    in_file = bytearray(b"LDX1 the batch")
    request = wire.BatchRequest(step=0)
    first = cache.serve(request, borrowed(in_file))
    assert first.frames[0].obj is in_file  # its own client's reply is the file's bytes
    first.release()
    in_file[:] = b"the next batch"  # its client reuses its file once answered
    hit = cache.serve(request, lambda: pytest.fail("computed again"))
    assert (hit.reuse, hit.borrowed, hit.payload) == (wire.REUSE_CACHED, False, b"LDX1 the batch")
    hit.release()


def test_a_batch_in_one_clients_file_is_copied_for_those_waiting_else_computed_again() -> None:
    cache = ShareCache(MemoryBudget(1 << 20, wait_s=1.0), capacity=0)
    request = wire.BatchRequest(step=0)
    building = threading.Event()
    in_file = bytearray(b"LDX1 the batch")

    def slow_build() -> EncodedBatch:
        building.set()
        deadline = time.monotonic() + 10
        while not waiting(cache):  # until the second request waits for this one
            assert time.monotonic() < deadline, "the second request never waited"
            time.sleep(0.005)
        return borrowed(in_file)()

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(cache.serve, request, slow_build)
        building.wait(10)
        second = cache.serve(request, lambda: pytest.fail("computed again"))
        first.result(10).release()
    in_file[:] = b"the next batch"
    assert (second.reuse, second.borrowed, second.payload) == (
        wire.REUSE_COALESCED,
        False,
        b"LDX1 the batch",
    )
    second.release()
    # Nobody waits and nothing is cached: no copy; a later request computes its own.
    later = bytearray(b"LDX1 again")
    cache.serve(request, borrowed(later)).release()
    again = cache.serve(request, borrowed(bytearray(b"LDX1 computed")))
    assert (again.reuse, again.payload) == (wire.REUSE_COMPUTED, b"LDX1 computed")
    again.release()


def waiting(cache: ShareCache) -> bool:
    """Whether a request waits for a computation under way in `cache`."""
    with cache._lock:
        return any(building.waiting for building in cache._building.values())


def test_a_mapping_is_kept_for_the_same_file_only_and_let_go_of_when_unused() -> None:
    mappings = shared_memory.Mappings(kept=2, kept_for_s=60)
    files = [MemoryFile(), MemoryFile(), MemoryFile()]
    try:
        named = files[0].wire
        first = mappings.mapped(named, files[0].fd, 100)
        assert len(first) >= 100
        assert mappings.mapped(named, files[0].fd, 50) is first  # kept: not mapped again
        assert mappings.mapped(named, files[0].fd, 1 << 20) is not first  # grown: mapped again
        # The same name, pid and descriptor, but another file: never its mapping.
        other = mappings.mapped(named, files[1].fd, 100)
        other[:3] = np.frombuffer(b"abc", np.uint8)
        assert os.pread(files[1].fd, 3, 0) == b"abc"
        assert os.pread(files[0].fd, 3, 0) == bytes(3)
        evicted = weakref.ref(other)
        del first, other
        for file in files[1:]:  # at most 2 kept: the first is let go of
            mappings.mapped(file.wire, file.fd, 100)
        gc.collect()
        assert evicted() is None
        briefly = shared_memory.Mappings(kept_for_s=0.05)
        kept = weakref.ref(briefly.mapped(named, files[0].fd, 100))
        deadline = time.monotonic() + 10
        while kept() is not None:  # let go of once unused for 0.05 s
            assert time.monotonic() < deadline, "a mapping was kept past kept_for_s"
            time.sleep(0.02)
    finally:
        for file in files:
            file.close()


@pytest.mark.parametrize("kind", [wire.CHECKSUM_XXH3_CHUNKS, wire.CHECKSUM_WEIGHTED_SUM])
def test_a_file_copied_into_is_written_at_its_first_use_and_mapped_from_its_second(
    kind: int,
) -> None:
    # Mapped at its first use, a file's pages would be zeroed before they are copied into.
    mappings = shared_memory.Mappings(kept=2, kept_for_s=60)
    file = MemoryFile(1 << 20)
    try:
        for use, mappings_of_file in enumerate([0, 2, 2]):  # then the client's and the worker's
            frames = encode_frames({"x": np.arange(300_000, dtype=np.int64) + use, "y": np.ones(7)})
            joined = b"".join(frames)
            into = shared_memory.ClientFile(file.wire, mappings=mappings)
            try:
                written = into.write(frames, kind)
            finally:
                into.close()
            assert written == (len(joined), checksum.payload_checksum(frames, kind))
            assert Path("/proc/self/maps").read_text().count(file.name) == mappings_of_file
            assert bytes(file.payload(len(joined))) == joined
    finally:
        file.close()
