"""Many clients on one worker, and the memory budget that keeps the worker's memory bounded.

The load test runs 16 clients as threads of this process, each with its own gRPC connection,
against one `loadax-worker` subprocess with `memory_budget_mb`. Threads represent the load
faithfully: the worker is its own process, and a client thread spends its time in gRPC's C core
(waiting, with the GIL released) or comparing arrays. Budget semantics are checked in-process,
where a gated dataset holds a batch mid-build for as long as a test needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
from pipelines import blobs
from workers import worker_with_settings

import loadax
from loadax.dataset.ops import DatasetBase
from loadax.errors import WorkerError
from loadax.execution.autotune import usable_cores
from loadax.execution.heap import loading_arenas
from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan
from loadax.server.worker import Worker
from loadax.wire.codec import decode
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

WAIT_S = 30.0  # the most anything here waits for what should come at once

CLIENTS = 16
IN_FLIGHT = 2  # each client's pipelined calls, and the worker's max_in_flight_per_client
RECORDS, FLOATS, BATCH = 256, 16384, 8  # 64 KiB records, 512 KiB batches
PLAN = Plan(RECORDS, BATCH, seed=7, shuffle=True, num_epochs=None)
STEPS = PLAN.steps_per_epoch  # every client asks for every step of an epoch, in its own order
HALF = list(range(BATCH // 2))  # odd clients ask for half the rows: another size to estimate
MEMORY_BUDGET_MB = 2  # the worker's memory budget: 3 full batches, or 7 halves
MEMORY_BUDGET = MEMORY_BUDGET_MB << 20
PIPELINE = "blobs"
BLOBS = f"""
[pipelines.blobs]
factory = "pipelines:blobs"
args = {{ records = {RECORDS}, floats = {FLOATS} }}
"""
TRANSPORT_ALLOWANCE = CLIENTS * IN_FLIGHT * BATCH * FLOATS * 4
"""Replies the budget no longer counts but gRPC still holds: one per call in flight."""
HEAPS = loading_arenas(CLIENTS, usable_cores())
"""The worker's C heaps: one per loading thread that can run at once, and the main one."""
RSS_ALLOWANCE = 3 * MEMORY_BUDGET * HEAPS + TRANSPORT_ALLOWANCE + (16 << 20)
"""How far the worker's peak RSS may rise above its peak at start: three times the budget (a
batch being built is its records, the collated batch and its encoding) in each heap (each keeps
its own peak: `loadax.execution.heap`), the replies in transit, and 16 MiB for allocator slack
and the handler threads' stacks (measured: +21-23 MiB in all with 3 heaps on 2 cores, +59 with
glibc's default of 8 heaps a core, which this bound refuses)."""


# --- the memory budget, in-process ------------------------------------------------------------


class GatedRecords(DatasetBase[Any]):
    """Records of 1,000 int64s; while `gate` is closed, reads block until it opens."""

    def __init__(self, records: int = 16) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.reads = 0
        self.started = threading.Event()
        self._records = records

    def __len__(self) -> int:
        return self._records

    def read(self, indices: IndexArray, epoch: int) -> list[Any]:
        self.reads += 1
        self.started.set()
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return [np.full(1000, index, dtype=np.int64) for index in indices.tolist()]


GATED_PLAN = Plan(16, batch_size=4)


def gated_worker(records: GatedRecords, budget: int, wait_s: float = WAIT_S) -> Worker:
    pipeline = loadax.Pipeline(records, loadax.Batcher())
    return Worker({"gated": pipeline}, threads=1, memory_budget_bytes=budget, memory_wait_s=wait_s)


def gated_request(worker: Worker, step: int, rows: list[int] | None = None) -> wire.BatchRequest:
    fingerprint = worker.info(wire.InfoRequest()).pipelines[0].fingerprint
    return wire.BatchRequest(
        pipeline="gated",
        fingerprint=fingerprint,
        plan=plan_to_wire(GATED_PLAN),
        step=step,
        rows=rows or [],
    )


def batch_of(response: EncodedBatch) -> Any:
    return decode(response.payload)


def served(worker: Worker, request: wire.BatchRequest) -> EncodedBatch:
    """`worker`'s answer to `request`, sent as a transport would: its budget share released."""
    batch = worker.load_batch(request)
    batch.release()
    return batch


class _Waits(logging.Handler):
    """Sets `seen` once the worker logs that a request waits for room in its budget."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "waits for" in record.getMessage():
            self.seen.set()


@contextlib.contextmanager
def watching_waits() -> Iterator[_Waits]:
    logger = logging.getLogger("loadax.server")
    handler, level = _Waits(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("budget", [0, -1, True, 1.5, "1"])
def test_the_memory_budget_must_be_a_positive_int(budget: Any) -> None:
    with pytest.raises(ValueError, match="memory_budget_bytes must be None or an int >= 1"):
        gated_worker(GatedRecords(), budget)


@pytest.mark.parametrize("wait_s", [0, -1.0, float("nan"), True, "1"])
def test_the_memory_wait_must_be_a_positive_number(wait_s: Any) -> None:
    with pytest.raises(ValueError, match="memory_wait_s must be a number > 0"):
        gated_worker(GatedRecords(), 1 << 20, wait_s)


def test_a_batch_larger_than_the_budget_is_refused_before_it_is_built() -> None:
    records = GatedRecords()
    worker = gated_worker(records, budget=20_000)  # a 4-row batch encodes to about 32 KB
    try:
        # The start-up probes (1 and 2 rows) told the budget the bytes per row.
        reads = records.reads
        with pytest.raises(WorkerError) as refused:
            worker.load_batch(gated_request(worker, 0))
        assert refused.value.code == "INVALID_ARGUMENT"
        message = refused.value.message
        assert "the batch of step 0 would be 32" in message
        assert "memory budget of 20000 bytes; ask for fewer rows" in message
        assert records.reads == reads
        # Fewer rows fit.
        half = served(worker, gated_request(worker, 1, rows=[0, 1]))
        np.testing.assert_array_equal(batch_of(half)[:, 0], [4, 5])
    finally:
        worker.close()


def test_a_huge_request_is_refused_without_reading_a_record() -> None:
    # 200,000 rows of 8 KB would be 1.6 GB: judged from the bytes per row, never built.
    records = GatedRecords(records=200_000)
    worker = gated_worker(records, budget=16 << 20)
    try:
        reads = records.reads
        request = gated_request(worker, 0)
        request.plan.CopyFrom(plan_to_wire(Plan(200_000, batch_size=200_000)))
        with pytest.raises(WorkerError) as refused:
            worker.load_batch(request)
        assert refused.value.code == "INVALID_ARGUMENT"
        assert "the batch of step 0 would be 16" in refused.value.message
        assert records.reads == reads
    finally:
        worker.close()


def test_a_request_waits_for_room_and_times_out_with_resource_exhausted() -> None:
    records = GatedRecords()
    probe = gated_worker(records, budget=1 << 20)
    size = len(served(probe, gated_request(probe, 0)).payload)
    probe.close()
    # Room for one batch, not two.
    worker = gated_worker(records, budget=size * 3 // 2, wait_s=0.5)
    try:
        served(worker, gated_request(worker, 0))  # learns the size
        records.gate.clear()
        records.started.clear()
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(served, worker, gated_request(worker, 1))
            assert records.started.wait(WAIT_S)
            with pytest.raises(WorkerError) as waited:
                worker.load_batch(gated_request(worker, 2))
            records.gate.set()
            np.testing.assert_array_equal(batch_of(held.result(WAIT_S))[:, 0], [4, 5, 6, 7])
        assert waited.value.code == "RESOURCE_EXHAUSTED"
        assert f"waited 0.5 s for {size} bytes" in waited.value.message
        assert f"memory budget of {size * 3 // 2} bytes ({size} in use" in waited.value.message
        # The bytes were released: the next request is served at once.
        np.testing.assert_array_equal(
            batch_of(served(worker, gated_request(worker, 3)))[:, 0], [12, 13, 14, 15]
        )
    finally:
        records.gate.set()
        worker.close()


def test_a_waiting_request_is_admitted_when_room_frees() -> None:
    records = GatedRecords()
    worker = gated_worker(records, budget=40_000)  # one 4-row batch (about 32 KB) at a time
    try:
        served(worker, gated_request(worker, 0))
        records.gate.clear()
        records.started.clear()
        with watching_waits() as waits, ThreadPoolExecutor(2) as pool:
            held = pool.submit(served, worker, gated_request(worker, 1))
            assert records.started.wait(WAIT_S)
            waiting = pool.submit(served, worker, gated_request(worker, 2))
            assert waits.seen.wait(WAIT_S), "the second request should wait for room"
            assert not waiting.done()
            records.gate.set()
            np.testing.assert_array_equal(batch_of(held.result(WAIT_S))[:, 0], [4, 5, 6, 7])
            np.testing.assert_array_equal(batch_of(waiting.result(WAIT_S))[:, 0], [8, 9, 10, 11])
    finally:
        records.gate.set()
        worker.close()


def test_a_kind_never_seen_reserves_what_its_pipelines_probes_tell() -> None:
    # The start-up probes (1 and 2 rows) give the bytes per row: a 4-row request, never seen,
    # reserves about 32 KB, not the whole budget, and does not wait behind another.
    records = GatedRecords()
    worker = gated_worker(records, budget=1 << 20)  # room for 30 such batches
    try:
        records.gate.clear()
        with watching_waits() as waits, ThreadPoolExecutor(2) as pool:
            first = pool.submit(served, worker, gated_request(worker, 0))
            assert records.started.wait(WAIT_S)
            second = pool.submit(served, worker, gated_request(worker, 1))
            deadline = time.monotonic() + WAIT_S
            while worker.memory_budget.reserved < 2 * 32_000 and time.monotonic() < deadline:
                time.sleep(0.01)  # until the second has reserved its bytes, next to the first
            assert 2 * 32_000 <= worker.memory_budget.reserved < 2 * 40_000
            assert not waits.seen.is_set()
            records.gate.set()
            assert batch_of(first.result(WAIT_S)).shape == (4, 1000)
            assert batch_of(second.result(WAIT_S)).shape == (4, 1000)
    finally:
        records.gate.set()
        worker.close()


# --- sixteen clients on one worker subprocess ---------------------------------------------------


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields


@dataclasses.dataclass
class Traffic:
    """Calls in flight across all clients: how many now, the most at once."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    now: int = 0
    most: int = 0

    def add(self, change: int) -> None:
        with self.lock:
            self.now += change
            self.most = max(self.most, self.now)


def run_client(
    address: str,
    index: int,
    expected: dict[tuple[int, bool], Any],
    start: threading.Barrier,
    traffic: Traffic,
) -> float:
    """Ask for every step of an epoch, `IN_FLIGHT` calls at a time; seconds from the common start
    to the last batch."""
    half = index % 2 == 1
    rows = HALF if half else []
    steps = [(index * 2 + offset) % STEPS for offset in range(STEPS)]
    options = [
        ("grpc.max_receive_message_length", 1 << 30),
        ("grpc.use_local_subchannel_pool", 1),  # a connection of its own: a client of its own
    ]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        handshake = stub.Handshake(
            wire.HandshakeRequest(
                library_version=loadax.__version__, pipeline=PIPELINE, plan=plan_to_wire(PLAN)
            ),
            timeout=WAIT_S,
            wait_for_ready=True,
        )
        start.wait(WAIT_S)
        began = time.monotonic()
        pending: deque[tuple[int, Any]] = deque()

        def check(step: int, call: Any) -> None:
            response = call.result()
            traffic.add(-1)
            assert response.step == step
            got, want = decode(response.payload), expected[(step, half)]
            np.testing.assert_array_equal(got["label"], want["label"], err_msg=f"step {step}")
            np.testing.assert_array_equal(got["x"], want["x"], err_msg=f"step {step}")

        for step in steps:
            if len(pending) == IN_FLIGHT:
                check(*pending.popleft())
            request = wire.BatchRequest(
                pipeline=PIPELINE,
                fingerprint=handshake.fingerprint,
                plan=plan_to_wire(PLAN),
                step=step,
                rows=rows,
            )
            traffic.add(1)
            pending.append((step, stub.LoadBatch.future(request, timeout=2 * WAIT_S)))
        while pending:
            check(*pending.popleft())
        return time.monotonic() - began


def test_sixteen_clients_get_correct_batches_and_the_worker_stays_within_its_memory(
    tmp_path: Any,
) -> None:
    pipeline = blobs(RECORDS, FLOATS)
    expected = {
        (step, half): pipeline.load(PLAN, step, HALF if half else None)
        for step in range(STEPS)
        for half in (False, True)
    }
    with worker_with_settings(
        tmp_path,
        f"memory_budget_mb = {MEMORY_BUDGET_MB}",
        BLOBS,
        threads=CLIENTS,  # the budget, not the loading threads, bounds the batches built
        max_in_flight_per_client=IN_FLIGHT,
    ) as served:
        at_start = memory_kib(served.process.pid)
        traffic = Traffic()
        start = threading.Barrier(CLIENTS)
        with ThreadPoolExecutor(CLIENTS) as pool:
            clients = [
                pool.submit(run_client, served.grpc_address, index, expected, start, traffic)
                for index in range(CLIENTS)
            ]
            seconds = [client.result(timeout=2 * WAIT_S) for client in clients]
        assert served.process.poll() is None, served.output()
        at_end = memory_kib(served.process.pid)
    rise_kib = at_end["VmHWM"] - at_start["VmHWM"]
    print(
        f"\n{CLIENTS} clients x {STEPS} batches of {BATCH * FLOATS * 4 >> 10} KiB (odd clients: "
        f"half the rows), at most {traffic.most} calls in flight at once\n"
        f"completion times (s): {', '.join(f'{s:.2f}' for s in seconds)}\n"
        f"worker RSS: {at_start['VmHWM'] >> 10} MiB peak at start, {at_end['VmHWM'] >> 10} MiB "
        f"peak after the load (+{rise_kib >> 10} MiB; memory budget {MEMORY_BUDGET >> 20} MiB, "
        f"{HEAPS} heaps, allowance +{RSS_ALLOWANCE >> 20} MiB)"
    )
    assert traffic.most > IN_FLIGHT * CLIENTS // 2, "the clients should load the worker at once"
    assert rise_kib * 1024 <= RSS_ALLOWANCE, (
        f"the worker's peak RSS rose by {rise_kib} KiB, more than the allowance of "
        f"{RSS_ALLOWANCE >> 10} KiB"
    )
