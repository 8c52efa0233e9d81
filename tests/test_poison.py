"""Poison records against real worker processes: work that kills the process loading it, or never
finishes, costs a child process (or, on threads, a loading thread), never the fleet; the trainer
gets a `PoisonedRecords` naming the records, and a wedged worker says it is NOT_SERVING."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import assert_batches_equal
from pipelines import numbers, poisoned
from workers import WorkerProcess, worker_env, worker_process, worker_processes

from loadax import DataLoader, RecordError
from loadax.client import RemoteDataLoader
from loadax.errors import PoisonedRecords
from loadax.server.config import load_config
from loadax.server.config_checks import ConfigError

DEADLINE_S = 2.0
POISONED = f"""
request_deadline_s = {DEADLINE_S}

[pipelines.killing]
factory = "pipelines:poisoned"
args = {{ records = 40, kill = 17 }}

[pipelines.hanging]
factory = "pipelines:poisoned"
args = {{ records = 40, hang = 17 }}

[pipelines.raising]
factory = "pipelines:poisoned"
args = {{ records = 40, raises = 17 }}

[pipelines.numbers]
factory = "pipelines:numbers"
args = {{ records = 30 }}
"""
BATCH = 4
POISON_STEP = 17 // BATCH
# Liveness: a poisoned batch is answered at the deadline (or at once, for a killed child), on
# two workers at most; the bound is well over 5x that.
RAISED_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """Three workers loading in one child process per pipeline, over gRPC and ZeroMQ."""
    directory = tmp_path_factory.mktemp("fleet")
    with worker_processes(
        directory, 3, POISONED, grpc=True, zmq=True, args=("--processes", "1")
    ) as workers:
        yield workers


def loader(workers: list[WorkerProcess], transport: str, pipeline: str) -> Any:
    return (
        RemoteDataLoader([worker.address(transport) for worker in workers], pipeline=pipeline)
        .batch_size(BATCH)
        .startup(min_workers=len(workers))
        .build()
    )


def poisoned_by(iterate: Any) -> PoisonedRecords:
    started = time.monotonic()
    with pytest.raises(PoisonedRecords) as raised:
        for _ in iterate:
            pass
    assert time.monotonic() - started < RAISED_WITHIN_S
    return raised.value


def assert_names_the_poisoned_batch(error: PoisonedRecords, reason: str) -> None:
    assert isinstance(error, RecordError)  # what the local loader raises for a record
    assert error.work == f"the batch of step {POISON_STEP}"
    assert error.rows == list(range(BATCH))
    assert error.indices == list(range(POISON_STEP * BATCH, POISON_STEP * BATCH + BATCH))
    assert error.epochs == [0] * BATCH
    assert reason in error.reason
    assert len(error.workers) == 2  # the first worker, and one more (poison_retries = 1)
    assert len(set(error.workers)) == 2
    assert "records [16, 17, 18, 19]" in str(error)


def assert_alive(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        assert worker.process.poll() is None, worker.output()


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_record_that_kills_its_child_is_a_record_error_and_every_worker_stays_up(
    fleet: list[WorkerProcess], transport: str
) -> None:
    with loader(fleet, transport, "killing") as killing:
        error = poisoned_by(iter(killing))
        assert_names_the_poisoned_batch(error, "exited with code 3")
        assert_alive(fleet)
        # Each child that died was replaced: the batches before the poisoned one load again.
        with iter(killing) as batches:
            again = [next(batches) for _ in range(POISON_STEP)]
    healthy = poisoned(40)  # the same records, none of them poison
    reference = DataLoader(healthy.batcher).batch_size(BATCH).build(healthy.dataset)
    assert_batches_equal(again, list(reference)[:POISON_STEP])
    with loader(fleet, transport, "numbers") as served:
        reference = DataLoader(numbers(1).batcher).batch_size(BATCH).build(numbers(30).dataset)
        assert_batches_equal(served, reference)


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_record_that_hangs_is_stopped_at_the_deadline_while_other_pipelines_are_served(
    fleet: list[WorkerProcess], transport: str
) -> None:
    with (
        loader(fleet, transport, "hanging") as hanging,
        loader(fleet, transport, "numbers") as served,
    ):
        outcome: Future[PoisonedRecords] = Future()
        thread = threading.Thread(target=lambda: outcome.set_result(poisoned_by(iter(hanging))))
        thread.start()
        # Served in full while the hanging batch holds a child of every worker it reached.
        reference = DataLoader(numbers(1).batcher).batch_size(BATCH).build(numbers(30).dataset)
        assert_batches_equal(served, reference)
        thread.join(RAISED_WITHIN_S)
        error = outcome.result(timeout=0)
    assert_names_the_poisoned_batch(error, f"deadline of {DEADLINE_S:g} s")
    assert_alive(fleet)


def test_a_record_that_raises_is_still_a_plain_record_error_asked_of_one_worker(
    fleet: list[WorkerProcess],
) -> None:
    with loader(fleet, "grpc", "raising") as raising, pytest.raises(RecordError) as raised:
        list(raising)
    assert not isinstance(raised.value, PoisonedRecords)
    assert (raised.value.index, raised.value.epoch) == (17, 0)
    assert "record 17 is corrupt" in str(raised.value)


def health(worker: WorkerProcess) -> int:
    with grpc.insecure_channel(worker.grpc_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def ping(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadax.client.cli", "ping", address],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=60,
    )


def test_a_worker_whose_threads_are_all_wedged_says_not_serving(tmp_path: Path) -> None:
    with worker_process(tmp_path, POISONED, grpc=True, zmq=True, threads=2) as worker:
        assert health(worker) == health_pb2.HealthCheckResponse.SERVING
        with loader([worker], "grpc", "hanging") as hanging:
            # Both attempts (the one worker is asked again) leave a thread stuck in record 17.
            error = poisoned_by(iter(hanging))
        assert_alive([worker])
        assert f"request_deadline_s = {DEADLINE_S:g} s" in error.reason
        assert error.workers == [worker.grpc, worker.grpc]
        deadline = time.monotonic() + 10.0  # the health service follows within 0.5 s
        while health(worker) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health still says SERVING"
            time.sleep(0.1)
        for address in (worker.address("grpc"), worker.address("zmq")):
            result = ping(address)
            assert result.returncode == 1, result.stdout + result.stderr
            assert "is not serving: all 2 loading threads are stuck" in result.stderr


def test_processes_and_the_deadline_are_checked_in_the_config(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    base = (
        '[server]\ngrpc = "127.0.0.1:0"\n{}\n[pipelines.numbers]\nfactory = "pipelines:numbers"\n'
    )
    for setting, message in (
        ("processes = -1", "[server].processes must be an int >= 0, got -1"),
        ('processes = "2"', '[server].processes must be an int >= 0, got "2"'),
        ("request_deadline_s = 0", "[server].request_deadline_s must be a number of seconds > 0"),
    ):
        path.write_text(base.format(setting))
        with pytest.raises(ConfigError, match=f"^{path}: " + message.replace("[", r"\[")):
            load_config(path)
    path.write_text(base.format("processes = 2\nrequest_deadline_s = 1.5"))
    config = load_config(path)
    assert (config.processes, config.request_deadline_s) == (2, 1.5)
    assert load_config(path, processes=0).processes == 0
