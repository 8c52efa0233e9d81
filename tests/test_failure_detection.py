"""Failure detection with default client settings: a worker killed, frozen or draining is left
within seconds, and one restarted on its address is used again within seconds; the batches stay
those of a local loader. Real worker processes, real signals, both transports."""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pipelines
import pytest
from equivalence import digests
from processes import free_port
from verifying import Verifying
from workers import WorkerProcess, pinned, worker_process, worker_processes

from loadax import DataLoader, WorkerError
from loadax.client import RemoteDataLoader
from loadax.client.member import handshake_request
from loadax.client.transports import connect
from loadax.client.transports.zmq import ZmqTransport
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork
from loadax.wire.plans import batch_request

RECORDS, FLOATS, BATCH, SEED = 192, 64, 4, 3
SIGNALLED_AFTER = 5  # batches


def blobs(delay: float) -> str:
    """The pipeline's config, each record taking `delay` seconds to read."""
    return f"""
[pipelines.blobs]
factory = "pipelines:blobs"
args = {{ records = {RECORDS}, floats = {FLOATS}, delay = {delay} }}
"""


BLOBS = blobs(0.02)  # ~80 ms a batch: an epoch outlasts the failure by a second or two
SLOW = blobs(0.25)  # 1 s a batch: a request is still in flight when its worker is frozen

# Liveness bounds: five times what each takes here, well inside the stalls before detection
# (60 s: requests queued to a dead ZeroMQ peer, or sent to a frozen gRPC worker).
LEFT_AT_ONCE_S = 5.0
"""A killed or draining worker: its connection closes, new requests fail at once (< 1 s)."""
FROZEN_S = 15.0
"""A frozen worker: heartbeats (ZeroMQ pings, gRPC messages) stop and fail it within ~2-3 s."""
BACK_S = 15.0
"""A restarted worker: reconnected within ~1 s, plus the loader's back-off for it (<= 2 s)."""


@pytest.fixture(scope="module")
def local() -> Callable[[int | None], list[str]]:
    """The digests of a local loader's batches: one epoch, or the first `count` of forever."""
    pipeline = pipelines.blobs(records=RECORDS, floats=FLOATS)
    loader = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(0)

    def batches(count: int | None) -> list[str]:
        if count is None:
            return digests(loader.build(pipeline.dataset))
        forever = loader.num_epochs(None).build(pipeline.dataset)
        return digests(itertools.islice(forever, count))

    return batches


def remote(targets: list[str]) -> RemoteDataLoader:
    """The loader under test: default failover settings, the local loader's plan."""
    return RemoteDataLoader(targets, pipeline="blobs").batch_size(BATCH).shuffle(seed=SEED)


def timed(iterator: Iterator[Any], count: int | None = None) -> tuple[list[Any], list[float]]:
    """The next `count` batches (all, if None) and the seconds each took since the previous one
    (the first: since this call)."""
    batches, gaps = [], []
    last = time.monotonic()
    for batch in itertools.islice(iterator, count):
        now = time.monotonic()
        batches.append(batch)
        gaps.append(now - last)
        last = now
    return batches, gaps


@contextlib.contextmanager
def resumed_at_the_end(worker: WorkerProcess) -> Iterator[None]:
    """A worker that the test may freeze: resumed when it ends, so that it can be killed."""
    try:
        yield
    finally:
        if worker.process.poll() is None:
            os.kill(worker.process.pid, signal.SIGCONT)


def signalled_mid_epoch(
    tmp_path: pathlib.Path, transport: str, number: signal.Signals
) -> tuple[list[Any], list[float], WorkerProcess]:
    """One epoch from two workers, the first sent `number` after `SIGNALLED_AFTER` batches:
    the batches, the gaps between those after the signal, and the signalled worker."""
    with worker_processes(tmp_path, 2, BLOBS, zmq=True) as running:
        victim = running[0]
        targets = [worker.address(transport) for worker in running]
        with resumed_at_the_end(victim), remote(targets).build() as loader:
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(SIGNALLED_AFTER)]
            assert loader.stats().workers[targets[0]].requests > 0  # it was serving
            os.kill(victim.process.pid, number)  # most likely with requests in flight on it
            rest, gaps = timed(iterator)
        if number == signal.SIGTERM:
            assert victim.process.wait(30) == 0, victim.output()
    return seen + rest, gaps, victim


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_killed_worker_is_left_at_once(
    tmp_path: pathlib.Path, transport: str, local: Callable[[int | None], list[str]]
) -> None:
    batches, gaps, _ = signalled_mid_epoch(tmp_path, transport, signal.SIGKILL)
    assert digests(batches) == local(None)
    assert max(gaps) < LEFT_AT_ONCE_S, gaps


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_frozen_worker_is_left_within_seconds(
    tmp_path: pathlib.Path, transport: str, local: Callable[[int | None], list[str]]
) -> None:
    batches, gaps, _ = signalled_mid_epoch(tmp_path, transport, signal.SIGSTOP)
    assert digests(batches) == local(None)
    assert max(gaps) < FROZEN_S, gaps


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_draining_worker_is_left_at_once_and_exits_0(
    tmp_path: pathlib.Path, transport: str, local: Callable[[int | None], list[str]]
) -> None:
    batches, gaps, victim = signalled_mid_epoch(tmp_path, transport, signal.SIGTERM)
    assert digests(batches) == local(None)
    assert max(gaps) < LEFT_AT_ONCE_S, gaps
    assert '{"event": "stopped"}' in victim.output().splitlines()


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_worker_restarted_on_its_address_is_used_again_within_seconds(
    tmp_path: pathlib.Path, transport: str, local: Callable[[int | None], list[str]]
) -> None:
    with pinned(tmp_path, transport) as fleet:
        first, helper = fleet.start(BLOBS), fleet.start(BLOBS)
        with remote([first, helper]).num_epochs(None).build() as loader:
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(SIGNALLED_AFTER)]
            fleet.running[0].process.kill()
            fleet.running[0].process.wait()
            # The helper serves alone while the loader keeps failing over from the dead address
            # (gRPC's own back-off, unbounded, would grow meanwhile: 1, 1.6, 2.6 s...).
            dead_until = time.monotonic() + 3.0
            while time.monotonic() < dead_until:
                seen.append(next(iterator))
            fleet.restart(0, BLOBS)  # on the same port; the first is dead already
            # Only the restarted worker is left: the next batches must come from it.
            loader.remove_target(helper)
            rest, gaps = timed(iterator, 20)
            assert loader.targets == [first]
    assert digests(seen + rest) == local(len(seen) + len(rest))
    assert max(gaps) < BACK_S, gaps


# The transports themselves: what the loader's placement relies on, whatever it makes of it.


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_frozen_workers_requests_fail_within_seconds_and_it_serves_once_resumed(
    tmp_path: pathlib.Path, transport: str
) -> None:
    plan = Plan(RECORDS, BATCH)
    hello = handshake_request("blobs", plan)
    with (
        worker_process(tmp_path, SLOW, zmq=True) as worker,
        resumed_at_the_end(worker),
        contextlib.closing(connect(worker.address(transport))) as opened,
    ):
        target = Verifying(opened)
        fingerprint = target.handshake(hello, 30.0).fingerprint
        requests = [batch_request("blobs", fingerprint, plan, StepWork(step)) for step in (1, 2)]
        in_flight = opened.send(requests[0])
        os.kill(worker.process.pid, signal.SIGSTOP)
        # Its heartbeats stop (gRPC: messages on the call) or go unanswered (ZeroMQ): it fails.
        error = in_flight.exception(FROZEN_S)
        assert isinstance(error, WorkerError), error
        assert error.code == "UNAVAILABLE"
        # So does a request sent now (gRPC: once 2 s pass without a heartbeat).
        error = opened.send(requests[1]).exception(LEFT_AT_ONCE_S)
        assert isinstance(error, WorkerError), error
        assert error.code == "UNAVAILABLE"
        os.kill(worker.process.pid, signal.SIGCONT)
        # A handshake waits for the connection; then batches are served again.
        assert target.handshake(hello, BACK_S).fingerprint == fingerprint
        assert target.load(requests[1], 30) is not None


def test_zeromq_batch_requests_fail_at_once_without_a_connection_and_handshakes_wait(
    tmp_path: pathlib.Path,
) -> None:
    port = free_port()
    pin = ["--zmq", f"tcp://127.0.0.1:{port}"]
    plan = Plan(RECORDS, BATCH)
    hello = handshake_request("blobs", plan)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    with ZmqTransport(f"zmq://127.0.0.1:{port}") as opened, ThreadPoolExecutor(1) as pool:
        target = Verifying(opened)
        # Sent before the worker listens: the handshake waits for it (as build() does).
        answer = pool.submit(target.handshake, hello, 60.0)
        with worker_process(tmp_path / "first", BLOBS, grpc=False, zmq=True, args=pin) as worker:
            fingerprint = answer.result(60).fingerprint
            request = batch_request("blobs", fingerprint, plan, StepWork(1))
            assert target.load(request, 30) is not None
            worker.process.kill()
            worker.process.wait()
            # The connection is gone: a batch request fails at once, for another worker to take.
            deadline = time.monotonic() + 10
            while True:
                started = time.monotonic()
                error = opened.send(request).exception(LEFT_AT_ONCE_S)
                if error is not None and "is not reachable" in str(error):
                    break
                assert time.monotonic() < deadline, "the dead worker's loss went unnoticed"
            assert isinstance(error, WorkerError)
            assert error.code == "UNAVAILABLE"
            assert time.monotonic() - started < 1.0
            # A handshake waits for the worker to be back instead.
            answer = pool.submit(target.handshake, hello, 60.0)
        with worker_process(tmp_path / "second", BLOBS, grpc=False, zmq=True, args=pin):
            assert answer.result(60).fingerprint == fingerprint
            assert target.load(request, 30) is not None
