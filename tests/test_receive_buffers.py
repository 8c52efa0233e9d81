"""The ZeroMQ client receives batch payloads into pooled buffers (`loadax.buffers`): a
steady stream reuses them, a batch (or a jax.Array made from it) that is held never changes,
replies whose frames do not fit their header are refused, and the client's memory stays within
its bound (over gRPC too). Real sockets: a `ZmqServer` in this process, a fake worker on a
ROUTER socket, and a worker and a client in processes of their own."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pipelines
import pytest
import zmq
from helpers import assert_batches_equal
from jax.sharding import Mesh
from verifying import Verifying
from workers import worker_processes

import loadax
import loadax.client.remote_loader
from loadax.buffers import BufferPool
from loadax.client import RemoteDataLoader
from loadax.client.fleet_options import FleetOptions
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import WorkerError
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_frames
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 10.0
RECORDS, BATCH = 160, 8  # a batch for each of 8 devices
FLOATS = 150_000  # 600 kB a record: a batch's array spans several payload frames
BLOBS = pipelines.blobs(records=RECORDS, floats=FLOATS)
PLAN = loadax.Plan(RECORDS, BATCH)
MAX_REPLY_BYTES = 8 << 20


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    worker = Worker({"blobs": BLOBS, "numbers": pipelines.numbers(30)})
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def server(worker: Worker) -> Iterator[str]:
    served = ZmqServer(worker, "tcp://127.0.0.1:0", threads=2)
    yield served.start().replace("tcp://", "zmq://", 1)
    served.stop(grace=WAIT_S)


def fingerprint(worker: Worker, pipeline: str) -> str:
    return {p.name: p.fingerprint for p in worker.info(wire.InfoRequest()).pipelines}[pipeline]


def request(worker: Worker, step: int, pipeline: str = "blobs") -> wire.BatchRequest:
    plan = PLAN if pipeline == "blobs" else loadax.Plan(30, 5)
    return wire.BatchRequest(
        pipeline=pipeline,
        fingerprint=fingerprint(worker, pipeline),
        plan=plan_to_wire(plan),
        step=step,
    )


def data_address(array: np.ndarray[Any, Any]) -> int:
    start: int = array.__array_interface__["data"][0]
    return start


def test_a_steady_stream_reuses_the_same_buffers(worker: Worker, server: str) -> None:
    buffers = BufferPool()
    with ZmqTransport(server, buffers=buffers, shared_memory=False) as transport:
        target = Verifying(transport)
        addresses = set()
        for step in range(20):
            batch = target.load(request(worker, step), WAIT_S)
            np.testing.assert_array_equal(batch["x"], BLOBS.load(PLAN, step)["x"])
            addresses.add(data_address(batch["x"]))
            del batch
        # The batch just dropped, and the one before it while that was still held.
        assert len(addresses) <= 2, addresses
        assert buffers.kept <= 2


def test_a_held_batch_is_never_a_buffer_handed_out_again(worker: Worker, server: str) -> None:
    buffers = BufferPool()
    with ZmqTransport(server, buffers=buffers, shared_memory=False) as transport:
        batch = Verifying(transport).load(request(worker, 0), WAIT_S)
        with pytest.raises(ValueError, match="read-only"):
            batch["x"][0] = 1.0
        size = batch["x"].nbytes
        for _ in range(3):
            assert not np.shares_memory(np.frombuffer(buffers.take(size), np.uint8), batch["x"])


def test_batches_and_jax_arrays_held_across_many_receives_never_change(server: str) -> None:
    reference = list(loadax.DataLoader(BLOBS.batcher).batch_size(BATCH).build(BLOBS.dataset))
    builder = RemoteDataLoader([server], pipeline="blobs").batch_size(BATCH).prefetch(4)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    with (
        builder.build() as hosts,
        builder.shard(mesh, "data").device_prefetch(2).build() as devices,
    ):
        held = [batch for step, batch in enumerate(hosts) if step % 2 == 0]
        put = [jax.device_put(batch["x"]) for step, batch in enumerate(hosts) if step % 3 == 0]
        globals_ = [batch for step, batch in enumerate(devices) if step % 2 == 1]
    assert_batches_equal(held, reference[::2])
    assert_batches_equal(put, [batch["x"] for batch in reference[::3]])
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(globals_))
    assert_batches_equal(globals_, reference[1::2])


# --- replies that do not fit their header, from a fake worker ---------------------------------

Frames = list[bytes | memoryview]


@dataclasses.dataclass
class FakeWorker:
    """A ROUTER socket that answers each request with the real worker's reply, rewritten."""

    worker: Worker
    socket: zmq.Socket[bytes]

    def answer(self, rewrite: Callable[[Frames], Frames] = lambda frames: frames) -> None:
        assert self.socket.poll(int(WAIT_S * 1000)), "no request came"
        identity, *frames = self.socket.recv_multipart()
        parsed = zmq_frames.parse_request(frames)
        assert isinstance(parsed.message, wire.BatchRequest)
        batch = self.worker.load_batch(parsed.message)
        try:
            reply = list(zmq_frames.reply_frames(parsed.request_id, batch))
            self.socket.send_multipart([identity, *rewrite(reply)])  # copies: released after
        finally:
            batch.release()


@pytest.fixture
def fake(worker: Worker) -> Iterator[tuple[FakeWorker, str]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    yield FakeWorker(worker, socket), f"zmq://127.0.0.1:{port}"
    socket.close(linger=0)
    context.term()


def declaring(change: Callable[[int], int]) -> Callable[[Frames], Frames]:
    """A rewrite of a batch reply whose header declares `change(payload_size)` bytes."""

    def rewrite(frames: Frames) -> Frames:
        header = wire.BatchResponse.FromString(bytes(frames[2]))
        header.payload_size = change(header.payload_size)
        return [*frames[:2], header.SerializeToString(), *frames[3:]]

    return rewrite


@pytest.mark.parametrize(
    ("rewrite", "match"),
    [
        (declaring(lambda size: size - 1), r"payload frames hold more than the \d+ bytes its "),
        (declaring(lambda size: 64), "hold more than the 64 bytes its header declares"),
        (declaring(lambda size: size + 64), r"its payload has \d+ bytes, its header says \d+"),
        (declaring(lambda size: MAX_REPLY_BYTES + 1), f"more than {MAX_REPLY_BYTES}"),
        (lambda frames: [*frames[:2], b"\xff\xff", *frames[3:]], "not a valid BatchResponse"),
    ],
    ids=["one-byte-more", "far-more", "fewer", "over-the-limit", "no-header"],
)
def test_a_reply_whose_frames_do_not_fit_its_header_is_refused_and_the_next_one_read(
    fake: tuple[FakeWorker, str],
    worker: Worker,
    rewrite: Callable[[Frames], Frames],
    match: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="loadax.client")
    fake_worker, address = fake
    buffers = BufferPool()
    with ZmqTransport(
        address, max_reply_bytes=MAX_REPLY_BYTES, buffers=buffers, shared_memory=False
    ) as transport:
        target = Verifying(transport)
        asked = request(worker, 1)
        refused = transport.send(asked)
        fake_worker.answer(rewrite)
        with pytest.raises(WorkerError, match=match) as caught:
            target.verify(asked, refused, WAIT_S)
        assert caught.value.code == "DATA_LOSS"
        # The rest of the refused reply was read: the next reply is whole, and nothing dropped.
        asked = request(worker, 2)
        answered = transport.send(asked)
        fake_worker.answer()
        batch = target.verify(asked, answered, WAIT_S)
        np.testing.assert_array_equal(batch["x"], BLOBS.load(PLAN, 2)["x"])
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    assert buffers.kept <= 2


# --- the client's memory, in a process of its own ---------------------------------------------

BATCH_MIB = 8
RSS_PIPELINE = f"""
[pipelines.blobs]
factory = "pipelines:blobs"
args = {{ records = 48, floats = {(BATCH_MIB << 20) // 4} }}
"""
PREFETCH = 4
CLIENT = f"""
import json, sys
import loadax.client.remote_loader
from loadax.client import RemoteDataLoader

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

loader = RemoteDataLoader(sys.argv[1:], pipeline="blobs").batch_size(1).prefetch({PREFETCH})
with loader.build() as built:
    base = resident()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak resident memory starts again from here
    batches = sum(1 for _ in built)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({{"base": base, "peak": int(peak.split()[1]) * 1024, "batches": batches}}))
"""


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
def test_the_clients_memory_stays_within_base_plus_in_flight_plus_two_batches(
    tmp_path: Path, transport: str
) -> None:
    # Over gRPC an 8 MiB batch is streamed (STREAM_FROM_BYTES): one whole reply is held twice.
    listen = {"grpc": transport == "grpc", "zmq": transport == "zmq"}
    with worker_processes(tmp_path, 1, RSS_PIPELINE, **listen) as served:
        result = subprocess.run(
            [sys.executable, "-c", CLIENT, served[0].address(transport)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    measured = json.loads(result.stdout)
    assert measured["batches"] == 48
    in_flight = PREFETCH + FleetOptions().in_flight_per_worker
    bound = measured["base"] + (in_flight + 2) * (BATCH_MIB << 20)
    assert measured["peak"] <= bound, (
        f"peak {measured['peak'] >> 20} MiB over base {measured['base'] >> 20} MiB + "
        f"{in_flight + 2} batches of {BATCH_MIB} MiB"
    )


def test_a_loaders_workers_share_one_pool_of_receive_buffers(
    worker: Worker, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One spare buffer between the workers, not one each.
    pools: list[BufferPool] = []

    class Recorded(BufferPool):
        def __init__(self) -> None:
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(loadax.client.remote_loader, "BufferPool", Recorded)
    second = ZmqServer(worker, "tcp://127.0.0.1:0", threads=2)
    address = second.start().replace("tcp://", "zmq://", 1)
    try:
        builder = (
            RemoteDataLoader([server, address], pipeline="blobs")
            .batch_size(BATCH)
            .shared_memory(False)
        )
        with builder.build() as loader:
            batches = list(loader)
            assert len(loader.targets) == 2
    finally:
        second.stop(grace=WAIT_S)
    assert len(batches) == RECORDS // BATCH
    assert len(pools) == 1
    assert pools[0].kept == len(batches)  # each held batch, from either worker, is one of its
