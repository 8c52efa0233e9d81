"""A thread member's batch is handed over without its encoding (`loadax.client.local_members`):
the loader gets the form a worker's reply decodes to, node for node; the reply is still checked
(its request, schema and rows); a batch held is never overwritten by the pooled buffers its
leaves came from, and a batch the driver drops is freed at once."""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import Future
from typing import Any

import local_member_pipelines
import ml_dtypes
import numpy as np
import pytest
from equivalence import forms, through_codec

from loadax import Batcher, DataLoader, Pipeline, Plan, RangeDataset, stack
from loadax.client import RemoteDataLoader
from loadax.client.driver import Driver
from loadax.client.fleet_options import FleetOptions
from loadax.client.local_members import LocalWorker, _LocalTransport
from loadax.client.member import ask, handshake_request
from loadax.client.replies import ReplyDecoder
from loadax.client.transports.reply import InProcess, Reply
from loadax.collate.batcher import _LEAF_BUFFERS, POOLED_FROM_BYTES
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server.worker import Worker
from loadax.wire.plans import batch_request
from loadax.wire.v1 import worker_pb2 as wire

RECORDS, BATCH, SEED = 48, 4, 3
PLAN = Plan(num_records=8, batch_size=BATCH)


def rich(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of every kind of node the codec carries: text, a strided view, a numpy scalar,
    bfloat16, a tuple, Python scalars and None."""
    stacked = stack(records)
    return {
        "stacked": stacked,
        "pair": (stacked["x"].T, len(records)),
        "mean": np.float32(stacked["noise"].mean()),
        "half": stacked["noise"].astype(ml_dtypes.bfloat16),
        "tags": [b"r", None, 0.5, True, "é"],
    }


def rich_pipeline() -> Pipeline[Any, Any]:
    noisy = local_member_pipelines.noisy_records(RECORDS)
    return Pipeline(noisy.dataset, Batcher(rich))


def test_thread_members_and_a_worker_give_the_form_a_workers_reply_decodes_to() -> None:
    pipeline = rich_pipeline()
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED)
    reference = forms(through_codec(local.build(pipeline.dataset)))
    worker = Worker({"rich": rich_pipeline()}, threads=1)
    remote = RemoteDataLoader([worker], pipeline="rich").batch_size(BATCH).shuffle(seed=SEED)
    try:
        with remote.local_members(2, pipeline=rich_pipeline()).build() as loader:
            assert forms(loader) == reference
            served = loader.stats().workers
            assert served["local 0"].requests + served["local 1"].requests > 0
    finally:
        worker.close()


def test_a_handed_over_batch_is_checked_for_its_request_schema_and_rows() -> None:
    worker = LocalWorker("p", Pipeline(RangeDataset(0, 8), Batcher()), None)
    decoder = ReplyDecoder("local 0")
    decoder.learn(worker.handshake(handshake_request("p", PLAN)))
    request, other = (
        batch_request("p", worker.fingerprint, PLAN, StepWork(step)) for step in (1, 1)
    )
    header = wire.BatchResponse(step=1, fingerprint=worker.fingerprint)

    def handed(answers: wire.BatchRequest, batch: Any) -> Any:
        reply: Future[Reply] = Future()
        reply.set_result(Reply(header, (), 0, InProcess(answers, handed_over=True, batch=batch)))
        return decoder.verify(request, reply)

    assert handed(request, np.arange(4, 8)).tolist() == [4, 5, 6, 7]
    # An equal request is not the one asked: a reply crossed with another's is refused.
    with pytest.raises(WorkerError, match=r"answers another request \(of step 1\)"):
        handed(other, np.arange(4, 8))
    with pytest.raises(WorkerError, match="has 3 rows, the request asked for 4"):
        handed(request, np.arange(4, 7))
    with pytest.raises(WorkerError, match="has dtype <f8, the schema says <i8"):
        handed(request, np.zeros(4))


def test_a_batch_held_is_not_overwritten_by_the_pooled_buffers_of_later_ones() -> None:
    # Each batch's leaf is 1 MiB, stacked into a buffer of the pool that takes a buffer back once
    # nothing refers to it: the batch held keeps its own, the others are reused (not leaked).
    floats = POOLED_FROM_BYTES // BATCH // 4
    pipeline = Pipeline(RangeDataset(0, 12 * BATCH).map(_filled(floats)), Batcher())
    worker = LocalWorker("p", pipeline, None)
    transport = _LocalTransport(worker, threads=2, name="local 0")
    plan = Plan(num_records=12 * BATCH, batch_size=BATCH)

    def batch(step: int) -> Any:
        request = batch_request("p", worker.fingerprint, plan, StepWork(step))
        reply = transport.send(request)
        reply.result(timeout=10)
        return ReplyDecoder("local 0").verify(request, reply)

    try:
        held = batch(0)
        kept = _LEAF_BUFFERS.kept
        for step in range(1, 12):
            assert batch(step)[:, 0].tolist() == list(range(step * BATCH, (step + 1) * BATCH))
        assert _LEAF_BUFFERS.kept <= kept + 2, "the batches let go were not taken back"
    finally:
        transport.close()
        transport.release()
    assert held.nbytes == POOLED_FROM_BYTES
    assert all((row == index).all() for index, row in enumerate(held))


def _filled(floats: int) -> Any:
    return lambda index: np.full(floats, index, np.float32)


def test_a_batch_the_driver_drops_is_freed_at_once() -> None:
    # The first member to make step 1 answers it, on its thread, only once the hedge sent to the
    # other one has answered; the batch it then hands over is dropped (its attempt cancelled, or
    # its answer late) and must be freed then, not kept by its reply, the driver or a cycle.
    sent, opened, freed = threading.Event(), threading.Event(), threading.Event()
    first = threading.Lock()  # taken by the first answer to step 1, never given back

    class Late(LocalWorker):
        def answer(self, request: Any, making: Any, slots: int) -> Reply:
            if sent.is_set() and first.acquire(blocking=False):
                weakref.finalize(making.result(), freed.set)
                assert opened.wait(timeout=10)
            return super().answer(request, making, slots)

    class Sending(_LocalTransport):
        def send(self, request: wire.BatchRequest) -> Future[Reply]:
            reply = super().send(request)
            sent.set()  # the batch is answered on the thread that makes it from now on
            return reply

    def record(index: int) -> np.ndarray[Any, Any]:
        if index >= BATCH:  # step 1's, once its answer waits on the member's thread
            assert sent.wait(timeout=10)
        return np.full(2, index)

    worker = Late("p", Pipeline(RangeDataset(0, 8).map(record), Batcher()), None)
    driver = Driver(FleetOptions(request_timeout=10.0, hedge_after=0.05))
    transports = [Sending(worker, threads=1, name=f"local {n}") for n in (0, 1)]
    for transport in transports:
        driver.join(ask(transport, handshake_request("p", PLAN), timeout=0))
    gc.disable()
    try:
        asked = batch_request("p", worker.fingerprint, PLAN, StepWork(1))
        answered = driver.submit(1, lambda: asked).result(timeout=10)  # the hedge's
        assert answered[:, 0].tolist() == [4, 5, 6, 7]
        opened.set()
        assert freed.wait(timeout=10), "the batch dropped was kept"
    finally:
        opened.set()
        gc.enable()
        driver.close()
        for transport in transports:
            transport.release()
