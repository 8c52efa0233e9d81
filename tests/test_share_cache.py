"""A worker computes each batch once: requests with one digest (of a sweep's jobs, or of a job's
processes that own the same rows) share one computation and a bounded cache of recent replies,
within the memory budget; every job still gets exactly the local batches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from equivalence import digests

import loadax
from loadax.client import RemoteDataLoader
from loadax.client.prometheus import LoaderCollector
from loadax.client.replies import ReplyDecoder
from loadax.errors import WorkerError
from loadax.iterators.stats import StatsRecorder
from loadax.plan.work import StepWork
from loadax.reuse import ReuseStats
from loadax.server.admission import Transport
from loadax.server.grpc_server import GrpcServer
from loadax.server.metrics import WorkerMetrics
from loadax.server.request_path import RequestPath
from loadax.server.worker import Worker
from loadax.wire.failures import RecordFailed
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import batch_request
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 30.0
PLAN = loadax.Plan(num_records=24, batch_size=4, seed=1, shuffle=True)
ROW_BYTES = 8 * 64
BAD = 23  # the record that fails


class Gated:
    """A pipeline whose records wait for `gate`, counting the records read."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.reading = threading.Event()
        self.reads = 0
        self.bad: int | None = None  # a record that fails, if any
        self._lock = threading.Lock()

    def record(self, index: int) -> dict[str, Any]:
        with self._lock:
            self.reads += 1
        self.reading.set()
        assert self.gate.wait(WAIT_S)
        if index == self.bad:
            raise ValueError(f"record {index} is damaged")
        return {"x": np.full(64, index, dtype=np.int64)}

    def pipeline(self) -> loadax.Pipeline[Any, Any]:
        return loadax.Pipeline(loadax.RangeDataset(0, 24).map(self.record), loadax.Batcher())


class Asker:
    """Asks a worker's request path for batches, as a transport's handler threads would."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.path = RequestPath(
            worker,
            Transport("test", send_token="none", counted="requests"),
            threads=2,
            max_in_flight_per_client=8,
        )
        handshake = wire.HandshakeRequest(
            library_version=loadax.__version__,
            pipeline="gated",
            plan=batch_request("gated", "", PLAN, StepWork(0)).plan,
        )
        self.fingerprint = worker.handshake(handshake).fingerprint

    def ask(
        self,
        client: str,
        step: int,
        rows: list[int] | None = None,
        wanted: Callable[[], bool] | None = None,
    ) -> bytes:
        reply = self.answer(client, step, rows, wanted)
        assert isinstance(reply, EncodedBatch), reply
        return reply.payload

    def answer(
        self,
        client: str,
        step: int,
        rows: list[int] | None = None,
        wanted: Callable[[], bool] | None = None,
        checksum: wire.Checksum | None = None,
    ) -> EncodedBatch | WorkerError:
        request = self.request(client, step, rows, checksum)
        held = self.path.arrive("connection", "test", request)
        assert self.path.admit(request, held) is None
        reply = self.path.answer(request, held, wanted)
        self.path.ledger.done(held)  # sent: the reply's bytes are let go of
        return reply

    def request(
        self, client: str, step: int, rows: list[int] | None, checksum: wire.Checksum | None
    ) -> wire.BatchRequest:
        work = StepWork(step, None if rows is None else np.array(rows))
        request = batch_request("gated", self.fingerprint, PLAN, work, client)
        if checksum is not None:
            request.checksum = checksum
        return request


@pytest.fixture
def gated() -> Gated:
    return Gated()


def worker_of(gated: Gated, **options: Any) -> Worker:
    worker = Worker({"gated": gated.pipeline()}, threads=2, **options)
    gated.reads = 0  # the start-up probes read some
    return worker


def test_concurrent_requests_of_one_digest_are_computed_once(gated: Gated) -> None:
    # Processes of one job that own the same rows (or a sweep's jobs) ask with ids of their own.
    worker = worker_of(gated)
    asker = Asker(worker)
    gated.gate.clear()
    waiting = threading.Semaphore(0)

    def waits() -> bool:
        waiting.release()  # asked while it waits for the other's computation
        return True

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(asker.ask, "process-0", 2, [1, 3])
        assert gated.reading.wait(WAIT_S)
        others = [pool.submit(asker.ask, f"process-{n}", 2, [1, 3], waits) for n in (1, 2)]
        for _ in others:
            assert waiting.acquire(timeout=WAIT_S)
        gated.gate.set()
        replies = [first.result(WAIT_S)] + [other.result(WAIT_S) for other in others]
    assert gated.reads == 2  # the two rows, once
    assert replies[1:] == replies[:1] * 2
    later = asker.ask("process-3", 2, [1, 3])  # a job a little behind: from the cache
    assert later == replies[0]
    assert gated.reads == 2
    assert asker.ask("process-0", 2, [0, 1]) != later  # other rows: another digest
    stats = worker.share_cache.stats()
    assert (stats.misses, stats.coalesced, stats.hits) == (2, 2, 1)
    assert stats.bytes_saved == 3 * len(later)
    assert worker.memory_budget.reserved == 0
    assert worker.memory_budget.cached == stats.size_bytes > 0
    worker.close()


def test_a_failure_of_the_work_is_every_waiting_requester_s_answer(gated: Gated) -> None:
    gated.bad = BAD
    worker = worker_of(gated)
    asker = Asker(worker)
    gated.gate.clear()
    waiting = threading.Semaphore(0)

    def waits() -> bool:
        waiting.release()
        return True

    step, rows = next(
        (step, [PLAN.indices(step).tolist().index(BAD)])
        for step in range(24 // PLAN.batch_size)
        if BAD in PLAN.indices(step)
    )
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(asker.answer, "a", step, rows)
        assert gated.reading.wait(WAIT_S)
        other = pool.submit(asker.answer, "b", step, rows, waits)
        assert waiting.acquire(timeout=WAIT_S)
        gated.gate.set()
        answers = [first.result(WAIT_S), other.result(WAIT_S)]
    assert all(isinstance(answer, RecordFailed) for answer in answers), answers
    assert gated.reads == 2  # as for one request: in the batch, then alone to name it
    worker.close()


def test_clients_asking_for_other_checksums_share_the_batch_each_with_its_own() -> None:
    gated = Gated()
    worker = worker_of(gated)
    asker = Asker(worker)
    for client, kind in (("new", wire.CHECKSUM_XXH3_64), ("old", wire.CHECKSUM_WEIGHTED_SUM)):
        reply = asker.answer(client, 1, checksum=kind)
        assert isinstance(reply, EncodedBatch), reply
        assert reply.header.checksum_kind == kind
        request = asker.request(client, 1, None, kind)
        assert ReplyDecoder("w").decode(request, reply.header, reply.frames)["x"].shape == (4, 64)
    assert gated.reads == PLAN.batch_size  # computed once
    assert worker.share_cache.stats().hits == 1
    worker.close()


def test_a_tiny_cache_evicts_and_a_miss_computes_the_same_bytes(gated: Gated) -> None:
    sizing = worker_of(gated)
    size = len(Asker(sizing).ask("a", 0))
    sizing.close()
    tiny = worker_of(gated, share_cache_bytes=size + 100)  # one reply
    asker = Asker(tiny)
    batches = [asker.ask("a", step) for step in (0, 1, 0, 0)]
    assert batches[0] == batches[2] == batches[3] != batches[1]
    stats = tiny.share_cache.stats()
    assert (stats.misses, stats.hits, stats.size_bytes) == (3, 1, size)
    assert gated.reads == 3 * PLAN.batch_size
    tiny.close()


def test_the_cache_gives_its_bytes_back_to_requests_that_wait_for_room(gated: Gated) -> None:
    # Room in the budget for one batch being built: without eviction, the second would wait
    # memory_wait_s and be refused RESOURCE_EXHAUSTED.
    budget = PLAN.batch_size * ROW_BYTES * 3 // 2
    worker = worker_of(gated, memory_budget_bytes=budget, share_cache_bytes=budget, memory_wait_s=5)
    asker = Asker(worker)
    for step in range(4):
        asker.ask("a", step)
    assert worker.memory_budget.reserved == 0
    assert 0 < worker.memory_budget.cached <= budget
    assert worker.share_cache.stats().misses == 4
    worker.close()


def test_sharing_is_off_with_a_cache_of_zero_bytes_but_still_coalesces(gated: Gated) -> None:
    worker = worker_of(gated, share_cache_bytes=0)
    asker = Asker(worker)
    assert asker.ask("a", 0) == asker.ask("b", 0)
    assert gated.reads == 2 * PLAN.batch_size
    assert worker.share_cache.stats().size_bytes == worker.memory_budget.cached == 0
    worker.close()


@pytest.fixture
def served(gated: Gated) -> Iterator[tuple[Worker, str]]:
    worker = worker_of(gated)
    server = GrpcServer(worker, "127.0.0.1:0", threads=2, max_in_flight_per_client=4)
    try:
        yield worker, server.start()
    finally:
        server.stop(grace=0)
        worker.close()


def test_every_job_of_a_sweep_gets_the_local_batches(
    gated: Gated, served: tuple[Worker, str]
) -> None:
    worker, address = served
    seeds = [1, 1, 1, 2]  # three jobs share; one with another seed shares nothing

    def run(seed: int) -> tuple[list[str], ReuseStats]:
        loader = RemoteDataLoader([f"grpc://{address}"], pipeline="gated")
        built = loader.batch_size(4).shuffle(seed=seed).num_epochs(2).prefetch(2).build()
        try:
            return digests(built), built.stats().reuse
        finally:
            built.close()

    with ThreadPoolExecutor(len(seeds)) as pool:
        remote, reuse = zip(*pool.map(run, seeds), strict=True)
    for seed, got in zip(seeds, remote, strict=True):
        local = loadax.DataLoader(loadax.Batcher()).batch_size(4).shuffle(seed=seed)
        pipeline = gated.pipeline()
        assert got == digests(local.num_epochs(2).build(pipeline.dataset))
    stats = worker.share_cache.stats()
    assert stats.misses == 2 * 12  # each batch of the two seeds' plans built once
    assert stats.hits + stats.coalesced == 2 * 12
    # Each client counts how its replies came; together, as the worker counted them.
    told = sum(reuse, ReuseStats())
    assert (told.misses, told.hits, told.coalesced) == (stats.misses, stats.hits, stats.coalesced)
    assert told.bytes_saved == stats.bytes_saved
    snapshot = StatsRecorder().snapshot(reuse=reuse[0])
    collected = {metric.name: metric for metric in LoaderCollector(lambda: snapshot).collect()}
    assert collected["loadax_client_reuse_hits"].samples[0].value == reuse[0].hits
    registry = WorkerMetrics(worker.memory_budget, worker.share_cache).registry
    assert registry.get_sample_value("loadax_worker_share_misses_total") == 2 * 12
    assert registry.get_sample_value("loadax_worker_share_cache_bytes") == stats.size_bytes
