"""Hard memory bounds in a worker's transports, whatever its clients do (DESIGN.md, "Bounded
memory"): real `loadax-worker` processes, real clients in processes of their own, and the
worker's resident memory read from /proc.

A test of a client's effect measures the worker's base RSS once it has served a well-behaved
client the same batches at the same concurrency (its allocator then holds what serving needs),
and allows the memory budget plus `SLACK_MIB` on top of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import zmq
from workers import WorkerProcess, worker_with_settings

import loadax
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.wire import zmq_frames
from loadax.wire.limits import MAX_REQUEST_BYTES, MAX_REQUEST_ROWS
from loadax.wire.payloads import LOAD_BATCH_PAYLOAD, STREAM_BATCH
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

BUDGET_MIB = 16
SLACK_MIB = 64
"""What a worker may hold beyond its budget: batches being built (their records, the collated
batch and its encoding), copies on their way to the socket, and what the allocator keeps."""
RECORDS = 2**28  # enough for a request of `MAX_REQUEST_ROWS` rows at the largest positions
PIPELINE = f"""
[pipelines.blobs]
factory = "pipelines:blobs"
args = {{ records = {RECORDS}, floats = 262144 }}
"""
"""Rows of 1 MiB: 262,144 float32 numbers each."""
TOKEN = "memory-bounds-token-0123456789"
SETTINGS = f'memory_budget_mb = {BUDGET_MIB}\ntoken_file = "token"\nmetrics = "127.0.0.1:0"'
CREDENTIALS = (("authorization", f"Bearer {TOKEN}"),)
SCHEMA_LOAD_BATCH = f"/{wire.DESCRIPTOR.services_by_name['Worker'].full_name}/LoadBatch"
ONE_ROW = loadax.Plan(RECORDS, batch_size=1)
WARM_UP_BATCHES = 128
IN_FLIGHT = 16  # the worker's max_in_flight_per_client (its config's default)
WATCH_S = 3.0  # how long a client that does not read is watched; unbounded memory grows ~250 MiB/s
RELEASED_WITHIN_S = 10.0  # what a gone client held is released in well under 0.5 s
TIMEOUT_S = 30.0

# Fires `count` batch requests on one channel with the raw stream, then waits, reading nothing
# once it is stopped.
GRPC_FLOOD = f"""
import sys, time, grpc, loadax
from loadax.plan.work import StepWork
from loadax.wire.payloads import LOAD_BATCH_PAYLOAD, STREAM_BATCH
from loadax.wire.plans import batch_request
address, fingerprint, count, token = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
plan = loadax.Plan({RECORDS}, batch_size=1)
channel = grpc.insecure_channel(address)
call = channel.unary_stream(STREAM_BATCH, request_serializer=lambda r: r.SerializeToString())
metadata = (("authorization", "Bearer " + token),)
calls = [
    call(batch_request("blobs", fingerprint, plan, StepWork(step)), metadata=metadata)
    for step in range(count)
]
print("fired", flush=True)
time.sleep(600)
"""

# One message of `frames` frames of `size` bytes (one buffer, sent without copies), no token.
ZMQ_FLOOD = """
import sys, time, zmq
endpoint, frames, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dealer = zmq.Context().socket(zmq.DEALER)
dealer.linger = 0
dealer.connect(endpoint)
dealer.send_multipart([bytearray(size)] * frames, copy=False)
print("sent", flush=True)
time.sleep(600)
"""

# Rounds of `per_round` batch requests, one round every 50 ms, never reading a reply.
ZMQ_DEAF = f"""
import sys, time, zmq, loadax
from loadax.plan.work import StepWork
from loadax.wire import zmq_frames
from loadax.wire.plans import batch_request
endpoint, fingerprint, token = sys.argv[1], sys.argv[2], sys.argv[5]
rounds, per_round = int(sys.argv[3]), int(sys.argv[4])
plan = loadax.Plan({RECORDS}, batch_size=1)
dealer = zmq.Context().socket(zmq.DEALER)
dealer.linger = 0
dealer.rcvhwm = 1  # its own queue fills at once: the replies wait at the worker
dealer.connect(endpoint)
print("sending", flush=True)
step = 0
for _ in range(rounds):
    for _ in range(per_round):
        request = batch_request("blobs", fingerprint, plan, StepWork(step))
        dealer.send_multipart(zmq_frames.request_frames(step, request, token))
        step += 1
    time.sleep(0.05)
time.sleep(600)
"""


def rss_mib(pid: int) -> float:
    """The resident memory of process `pid` (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def peak_rss_mib(pid: int, seconds: float, limit: float) -> float:
    """The highest RSS of process `pid` sampled over `seconds`; sampling stops once above
    `limit`, so that a test of a worker that does not bound its memory fails at once."""
    peak = rss_mib(pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end and peak <= limit:
        time.sleep(0.02)  # sampling, not synchronisation
        peak = max(peak, rss_mib(pid))
    return peak


def reserved_bytes(worker: WorkerProcess) -> float:
    """The worker's memory budget in use, from its metrics."""
    with urllib.request.urlopen(f"http://{worker.metrics}/metrics", timeout=TIMEOUT_S) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("loadax_worker_memory_reserved_bytes "):
                return float(line.split()[1])
    raise AssertionError("the worker has no loadax_worker_memory_reserved_bytes")


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether `condition()` came true within `timeout` seconds (polled: it is another
    process's state)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def bounded_worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    """A worker of 1 MiB rows with a 16 MiB budget and a token, serving both transports."""
    (tmp_path / "token").write_text(TOKEN)
    with worker_with_settings(tmp_path, SETTINGS, PIPELINE, zmq=True) as worker:
        yield worker


@contextlib.contextmanager
def client(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A client running `code` in a process of its own, once it has printed its first line;
    killed (-9) at the end."""
    child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline(), f"the client exited with status {child.wait()}"
        yield child
    finally:
        child.kill()
        child.communicate()


def fingerprint(worker: WorkerProcess) -> str:
    with grpc.insecure_channel(worker.grpc_address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        request = wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline="blobs", plan=plan_to_wire(ONE_ROW)
        )
        return str(stub.Handshake(request, metadata=CREDENTIALS, timeout=TIMEOUT_S).fingerprint)


def grpc_batches(worker: WorkerProcess, plan: loadax.Plan, works: list[StepWork]) -> None:
    """Load `works` over gRPC, `IN_FLIGHT` at a time, reading every reply."""
    name = fingerprint(worker)
    with grpc.insecure_channel(worker.grpc_address) as channel:
        call = channel.unary_stream(
            STREAM_BATCH, request_serializer=wire.BatchRequest.SerializeToString
        )
        for start in range(0, len(works), IN_FLIGHT):
            calls = [
                call(
                    batch_request("blobs", name, plan, work),
                    metadata=CREDENTIALS,
                    timeout=TIMEOUT_S,
                )
                for work in works[start : start + IN_FLIGHT]
            ]
            for messages in calls:
                assert sum(map(len, messages)) > 1 << 20


def zmq_batches(worker: WorkerProcess, works: list[StepWork]) -> list[zmq_frames.BatchReply]:
    """Load `works` of `ONE_ROW` over ZeroMQ, `IN_FLIGHT` at a time, reading every reply."""
    name = fingerprint(worker)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.rcvtimeo = int(TIMEOUT_S * 1000)
    dealer.connect(worker.address("zmq").replace("zmq://", "tcp://", 1))
    replies = []
    try:
        for start in range(0, len(works), IN_FLIGHT):
            chunk = works[start : start + IN_FLIGHT]
            for index, work in enumerate(chunk):
                request = batch_request("blobs", name, ONE_ROW, work)
                dealer.send_multipart(zmq_frames.request_frames(start + index, request, TOKEN))
            replies += [zmq_frames.parse_batch_reply(dealer.recv_multipart()) for _ in chunk]
    finally:
        dealer.close()
        context.term()
    return replies


def warm_up(worker: WorkerProcess, transport: str) -> float:
    """Serve a well-behaved client over `transport`; the worker's RSS then, in MiB."""
    works = [StepWork(step) for step in range(WARM_UP_BATCHES)]
    if transport == "grpc":
        grpc_batches(worker, ONE_ROW, works)
    else:
        zmq_batches(worker, works)
    return rss_mib(worker.process.pid)


def assert_bounded(worker: WorkerProcess, base: float, watch_s: float) -> float:
    """The worker's RSS stays within its budget and `SLACK_MIB` of `base` for `watch_s`
    seconds; its peak."""
    bound = base + BUDGET_MIB + SLACK_MIB
    peak = peak_rss_mib(worker.process.pid, watch_s, bound)
    print(f"worker RSS: base {base:.0f} MiB, peak {peak:.0f} MiB")
    assert peak <= bound, f"the worker's RSS rose from {base:.0f} MiB to {peak:.0f} MiB"
    return peak


def assert_released(worker: WorkerProcess, base: float) -> None:
    """Once a client is gone, nothing of the budget is held for it, and the worker's RSS is
    within `SLACK_MIB` of `base`."""
    assert wait_until(lambda: reserved_bytes(worker) == 0, RELEASED_WITHIN_S), (
        f"{reserved_bytes(worker):.0f} bytes of the budget are still held for a client that is gone"
    )
    after = rss_mib(worker.process.pid)
    print(f"worker RSS once the client is gone: {after:.0f} MiB")
    assert after <= base + SLACK_MIB, f"the worker still holds {after - base:.0f} MiB more"


def test_a_grpc_client_that_does_not_read_its_replies_holds_at_most_its_limit(
    tmp_path: Path,
) -> None:
    with bounded_worker(tmp_path) as worker:
        base = warm_up(worker, "grpc")
        with client(GRPC_FLOOD, worker.grpc_address, fingerprint(worker), "2000", TOKEN) as flood:
            os.kill(flood.pid, signal.SIGSTOP)  # its socket is no longer read
            assert_bounded(worker, base, WATCH_S)
        assert_released(worker, base)
        # Its calls no longer count: another client is served in full.
        grpc_batches(worker, ONE_ROW, [StepWork(step) for step in range(IN_FLIGHT)])


def test_a_zmq_message_of_large_frames_without_the_token_is_not_buffered(
    tmp_path: Path,
) -> None:
    with bounded_worker(tmp_path) as worker:
        base = warm_up(worker, "zmq")
        endpoint = worker.address("zmq").replace("zmq://", "tcp://", 1)
        with client(ZMQ_FLOOD, endpoint, "256", str(8 << 20)):
            assert_bounded(worker, base, WATCH_S)
        assert_released(worker, base)
        assert len(zmq_batches(worker, [StepWork(0)])) == 1


def test_a_zmq_client_that_does_not_read_its_replies_holds_at_most_its_limit(
    tmp_path: Path,
) -> None:
    with bounded_worker(tmp_path) as worker:
        base = warm_up(worker, "zmq")
        endpoint = worker.address("zmq").replace("zmq://", "tcp://", 1)
        # A round of requests every 50 ms for 5 s: a worker that forgets a reply once it has
        # handed it to libzmq admits each round anew.
        args = (endpoint, fingerprint(worker), "100", str(IN_FLIGHT), TOKEN)
        with client(ZMQ_DEAF, *args):
            assert_bounded(worker, base, WATCH_S)
            # The replies it has not taken still count.
            assert reserved_bytes(worker) > 0
        assert_released(worker, base)


def test_a_request_for_more_rows_than_the_budget_holds_is_refused_before_it_is_built(
    tmp_path: Path,
) -> None:
    with bounded_worker(tmp_path) as worker:
        base = warm_up(worker, "grpc")
        plan = loadax.Plan(RECORDS, batch_size=200_000)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            grpc_batches(worker, plan, [StepWork(0)])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than this worker's memory budget" in refused.value.details()
        # Building it would read 200,000 records of 1 MiB.
        assert time.monotonic() - started < TIMEOUT_S
        assert_bounded(worker, base, 0.0)


def unparsable_calls(worker: WorkerProcess, count: int) -> set[grpc.StatusCode]:
    """The codes of `count` batch calls over one connection whose bodies do not parse, a third
    to each batch method, `IN_FLIGHT` at a time."""
    codes = set()
    with grpc.insecure_channel(worker.grpc_address) as channel:
        methods = [
            channel.unary_stream(STREAM_BATCH),
            channel.unary_unary(LOAD_BATCH_PAYLOAD).future,
            channel.unary_unary(SCHEMA_LOAD_BATCH).future,
        ]
        for start in range(0, count, IN_FLIGHT):
            calls = [
                methods[index % 3](b"\x00", metadata=CREDENTIALS, timeout=TIMEOUT_S)
                for index in range(start, min(start + IN_FLIGHT, count))
            ]
            codes |= {call.code() for call in calls}
    return codes


def test_grpc_requests_that_do_not_parse_leave_nothing_behind(tmp_path: Path) -> None:
    with bounded_worker(tmp_path) as worker:
        assert unparsable_calls(worker, 200) == {grpc.StatusCode.INTERNAL}
        base = rss_mib(worker.process.pid)
        assert unparsable_calls(worker, 2_000) == {grpc.StatusCode.INTERNAL}
        # When gRPC parses a request itself and fails, it keeps the call's stream and about
        # 15 KiB for good: 30 MiB here, and the connection refused once it has
        # max_concurrent_rpcs of them.
        grew = rss_mib(worker.process.pid) - base
        assert grew < 16, f"2,000 calls that did not parse left {grew:.0f} MiB behind"
        grpc_batches(worker, ONE_ROW, [StepWork(0)])


def largest_request(name: str) -> wire.BatchRequest:
    """A request for `MAX_REQUEST_ROWS` rows at the largest positions it may name."""
    plan = loadax.Plan(RECORDS, batch_size=RECORDS)
    rows = np.arange(RECORDS - MAX_REQUEST_ROWS, RECORDS)
    return batch_request("blobs", name, plan, StepWork(0, rows))


def test_the_largest_request_fits_the_request_limit() -> None:
    request = largest_request("f" * 64)
    request.pipeline = "p" * 1000
    request.plan.seed = request.plan.num_epochs = request.step = 2**64 - 1
    assert request.ByteSize() <= MAX_REQUEST_BYTES


def test_the_largest_request_reaches_the_worker_on_both_transports(tmp_path: Path) -> None:
    with bounded_worker(tmp_path) as worker:
        request = largest_request(fingerprint(worker))
        assert request.ByteSize() > 4 << 20
        # The worker reads it, and refuses it for its size in memory, not on the wire.
        with (
            grpc.insecure_channel(worker.grpc_address) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            worker_pb2_grpc.WorkerStub(channel).LoadBatch(
                request, metadata=CREDENTIALS, timeout=TIMEOUT_S
            )
        assert "more than this worker's memory budget" in refused.value.details()
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.rcvtimeo = int(TIMEOUT_S * 1000)
        try:
            dealer.connect(worker.address("zmq").replace("zmq://", "tcp://", 1))
            dealer.send_multipart(zmq_frames.request_frames(1, request, TOKEN))
            with pytest.raises(WorkerError) as error:
                zmq_frames.parse_batch_reply(dealer.recv_multipart())
        finally:
            dealer.close()
            context.term()
        assert "more than this worker's memory budget" in error.value.message
