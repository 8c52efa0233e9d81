"""The fleet on default settings: load-aware placement, in-flight depth within each worker's limit,
hung workers passed over by their latency, the time to the error, and a forgiving start-up.

Real worker processes on loopback, both transports; batches are checked byte for byte against
the local loader's. Liveness bounds are at least 5x the time expected.
"""

from __future__ import annotations

import contextlib
import itertools
import pathlib
import socket
import threading
import time
from typing import Any

import pipelines
import pytest
from equivalence import digests
from workers import pinned, stopped, worker_process, worker_processes

from loadax import Batcher, DataLoader, Pipeline, RangeDataset, WorkerError
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker
from loadax.wire.v1 import worker_pb2 as wire

RECORDS, BATCH, SEED = 96, 4, 5
PACED = f"""
[pipelines.paced]
factory = "pipelines:paced"
args = {{ records = {RECORDS}, delay = 0.005 }}
"""


@pytest.fixture(scope="module")
def reference() -> list[str]:
    pipeline = pipelines.paced(records=RECORDS, delay=0.0)
    loader = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(0)
    return digests(loader.build(pipeline.dataset))


def local_epochs(steps: int) -> list[str]:
    """The digests of the local loader's first `steps` batches, epoch after epoch."""
    pipeline = pipelines.paced(records=RECORDS, delay=0.0)
    loader = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).num_epochs(None)
    iterator = iter(loader.workers(0).build(pipeline.dataset))
    return digests([next(iterator) for _ in range(steps)])


def paced(targets: list[Any]) -> RemoteDataLoader:
    """The loader of the paced pipeline with default fleet settings."""
    return RemoteDataLoader(targets, pipeline="paced").batch_size(BATCH).shuffle(seed=SEED)


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_straggler_gets_fewer_requests_and_changes_no_batch(
    tmp_path: pathlib.Path, transport: str, reference: list[str]
) -> None:
    with contextlib.ExitStack() as stack:
        running = []
        for index in range(4):
            home = tmp_path / f"worker{index}"
            home.mkdir()
            slowdown = "10" if index == 0 else "1"  # worker 0 is ten times slower
            running.append(
                stack.enter_context(
                    worker_process(
                        home, PACED, zmq=transport == "zmq", env={"LOADAX_TEST_SLOWDOWN": slowdown}
                    )
                )
            )
        targets = [worker.address(transport) for worker in running]
        with paced(targets).build() as loader:
            batches = digests(loader)
            workers = loader.stats().workers
    assert batches == reference
    straggler, *healthy = (workers[target] for target in targets)
    assert all(stats.failures == 0 for stats in workers.values()), workers
    assert straggler.requests < min(stats.requests for stats in healthy), workers


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_the_client_keeps_within_the_limit_each_worker_announces(
    tmp_path: pathlib.Path, transport: str, reference: list[str]
) -> None:
    # The client asks for far more than the worker allows it: it sends only what is allowed.
    with worker_process(
        tmp_path, PACED, zmq=transport == "zmq", max_in_flight_per_client=2
    ) as worker:
        target = worker.address(transport)
        builder = paced([target]).prefetch(8).in_flight_per_worker(8)
        with builder.build() as loader:
            batches = digests(loader)
            stats = loader.stats().workers[target]
    assert batches == reference
    assert (stats.failures, stats.last_error) == (0, None)
    assert stats.requests == len(reference)


@pytest.mark.parametrize("hedging", [True, False])
def test_a_hung_worker_is_passed_over_by_its_latency_not_a_fixed_deadline(hedging: bool) -> None:
    release = threading.Event()

    class Hung:
        """Handshakes, then never answers a batch (until the test ends)."""

        def __init__(self, worker: Worker) -> None:
            self._worker = worker

        def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
            return self._worker.handshake(request)

        def load_batch(self, request: wire.BatchRequest) -> Any:
            release.wait()
            return self._worker.load_batch(request)

    def numbers() -> Worker:
        return Worker({"numbers": Pipeline(RangeDataset(0, 400), Batcher())}, threads=1)

    good, frozen = numbers(), numbers()
    try:
        started = time.monotonic()
        # The default request_timeout (60 s) never comes within the test.
        builder = RemoteDataLoader([Hung(frozen), good], pipeline="numbers").batch_size(4)
        if not hedging:
            builder = builder.hedge_after(None)
        with builder.build() as loader:
            batches = [batch.tolist() for batch in loader]
            stats = loader.stats().workers["in-process Hung"]
        elapsed = time.monotonic() - started
    finally:
        release.set()
        good.close()
        frozen.close()
    assert batches == [list(range(step, step + 4)) for step in range(0, 400, 4)]
    assert elapsed < 30, elapsed  # a hang is hedged, or judged within about a second
    # Its requests are outstanding ever longer: it is sent no more once their age passes the
    # good worker's latency (a few at the start, more on a loaded machine, where that latency is
    # longer), where a member alike would take half of the 100.
    assert stats.requests <= 10, stats
    # Never answered: it may be starting (loader processes, imports), so its attempts given up
    # as hung are re-issued but not held against it.
    assert (stats.failures, stats.quarantined) == (0, None), stats


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_no_worker_timeout_is_the_time_to_the_error(tmp_path: pathlib.Path, transport: str) -> None:
    limit = 3.0
    with worker_processes(tmp_path, 2, PACED, zmq=transport == "zmq") as running:
        targets = [worker.address(transport) for worker in running]
        with paced(targets).num_epochs(None).no_worker_timeout(limit).build() as loader:
            iterator = iter(loader)
            for _ in range(4):
                next(iterator)
            with stopped(*running):
                frozen = time.monotonic()
                with pytest.raises(WorkerError, match="UNAVAILABLE") as raised:
                    list(itertools.islice(iterator, 10_000))
                elapsed = time.monotonic() - frozen
    assert limit - 0.5 <= elapsed <= limit + 1.5, elapsed
    message = str(raised.value)
    assert f"no worker answered for {limit:g} s" in message
    assert all(target in message for target in targets), message


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_build_proceeds_without_a_dead_target_and_adds_it_when_it_starts(
    tmp_path: pathlib.Path, transport: str, reference: list[str]
) -> None:
    with pinned(tmp_path, transport) as fleet:
        live = fleet.start(PACED)
        later = fleet.address()
        started = time.monotonic()
        loader = paced([live, later]).num_epochs(None).build()
        with loader:
            built = time.monotonic() - started
            assert loader.targets == [live]
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(4)]
            fleet.start_at(later, PACED)
            deadline = time.monotonic() + 30
            while later not in loader.targets:
                assert time.monotonic() < deadline, loader.stats()
                seen.append(next(iterator))
            while loader.stats().workers[later].requests == 0:
                assert time.monotonic() < deadline, loader.stats()
                seen.append(next(iterator))
    assert built < 5, built  # not the 30 s start-up timeout: a second of grace
    assert digests(seen) == local_epochs(len(seen))


def test_a_name_that_resolves_only_later_joins(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    with worker_processes(tmp_path, 2, PACED) as running:
        port = running[1].address("grpc").rsplit(":", 1)[1]
        resolvable_at = time.monotonic() + 1.5

        def resolver(host: str) -> list[str]:
            # A pod not ready yet: its name does not resolve for a while.
            if time.monotonic() < resolvable_at:
                raise socket.gaierror(socket.EAI_NONAME, f"{host}: Name or service not known")
            return ["127.0.0.1"]

        late = f"grpc://worker.late.test:{port}"
        builder = RemoteDataLoader(
            [running[0].address("grpc"), late], pipeline="paced", resolver=resolver
        )
        with builder.batch_size(BATCH).shuffle(seed=SEED).build() as loader:
            deadline = time.monotonic() + 30
            while f"grpc://127.0.0.1:{port}" not in loader.targets:
                assert time.monotonic() < deadline, loader.stats()
                time.sleep(0.05)
            batches = digests(loader)
    assert batches == reference


def test_a_name_that_never_resolves_fails_the_build_naming_it() -> None:
    def resolver(host: str) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, f"{host}: Name or service not known")

    builder = RemoteDataLoader(["grpc://nowhere.test:1"], pipeline="paced", resolver=resolver)
    started = time.monotonic()
    with pytest.raises(WorkerError, match="UNAVAILABLE") as raised:
        builder.batch_size(BATCH).startup(timeout=1.0).build()
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert "grpc://nowhere.test:1: the name does not resolve" in message, message
    assert "Name or service not known" in message, message


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_build_with_no_live_target_fails_at_the_startup_timeout_naming_each(
    tmp_path: pathlib.Path, transport: str
) -> None:
    with pinned(tmp_path, transport) as fleet:
        targets = [fleet.address(), fleet.address()]
        started = time.monotonic()
        with pytest.raises(WorkerError, match="UNAVAILABLE") as raised:
            paced(targets).startup(timeout=1.0).build()
        elapsed = time.monotonic() - started
    assert elapsed < 10, elapsed
    message = str(raised.value)
    assert "0 of 2 targets agreed" in message, message
    assert all(f"{target}: " in message for target in targets), message
