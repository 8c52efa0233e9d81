"""Failures told at once, with real workers: a dead fleet is one error on time after the batches
already received, a fleet replaced by other code fails within seconds naming it, identities
that tie at build are an error (or a pin decides), and a slow-starting worker is not quarantined.
"""

from __future__ import annotations

import logging
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import failure_pipelines
import pytest
from processes import free_port
from workers import pinned, worker_process, worker_processes

from loadax import DataLoader, WorkerError
from loadax.client import RemoteDataLoader
from loadax.logfields import of_record


def images(side: int, records: int = 96) -> str:
    return f"""
[pipelines.images]
factory = "pipelines:images"
args = {{ records = {records}, side = {side} }}
"""


def builder(targets: list[Any]) -> RemoteDataLoader:
    return RemoteDataLoader(targets, pipeline="images").batch_size(4).shuffle(seed=11).prefetch(4)


NO_WORKER_TIMEOUT = 3.0


def drain(iterator: Iterator[Any]) -> None:
    for _ in iterator:
        pass


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_dead_fleet_is_one_error_on_time_after_the_batches_received(
    tmp_path: pathlib.Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    with worker_processes(tmp_path, 2, images(8), zmq=True) as running:
        targets = [worker.address(transport) for worker in running]
        loader = builder(targets).device_prefetch(2).no_worker_timeout(NO_WORKER_TIMEOUT).build()
        iterator = iter(loader)
        for _ in range(3):
            next(iterator)
        for worker in running:
            worker.process.kill()
            worker.process.wait()
        killed = time.monotonic()
        with (
            caplog.at_level(logging.WARNING, logger="loadax.client"),
            # Silent since its last answer, or failing every request since the kill: one error.
            pytest.raises(
                WorkerError,
                match=r"no worker answered for 3 s|every worker failed step \d+ for 3 s",
            ) as raised,
        ):
            drain(iterator)  # the batches received before the kill, then the error
        waited = time.monotonic() - killed
        loader.close()
    # One timeout from the fleet's last answer (before the kill), never one per batch ahead.
    assert waited < NO_WORKER_TIMEOUT + 1.5, waited
    for target in targets:
        assert f"{target} (UNAVAILABLE" in raised.value.message
    warnings = [r for r in caplog.records if "every worker is failing" in r.getMessage()]
    assert warnings, caplog.text
    assert all(target in warnings[0].getMessage() for target in targets)
    # Its facts as fields too, for structured logs.
    assert of_record(warnings[0])["event"] == "fleet_failing"
    assert of_record(warnings[0])["status"] == "UNAVAILABLE"


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_fleet_replaced_by_other_code_fails_within_seconds(
    tmp_path: pathlib.Path, transport: str
) -> None:
    with pinned(tmp_path, transport) as fleet:
        for _ in range(2):
            fleet.start(images(8))
        loader = builder(fleet.targets).no_worker_timeout(120).build()
        iterator = iter(loader)
        next(iterator)
        for index in range(2):  # a rolling update: each worker restarted with other code
            fleet.restart(index, images(9))
        updated = time.monotonic()
        with pytest.raises(WorkerError, match="the fleet now serves another") as raised:
            list(iterator)
        waited = time.monotonic() - updated
        loader.close()
    # Quarantine probes come every 1 to 4 s: the error within seconds, not at 120 s.
    assert waited < 25.0, waited
    assert raised.value.code == "FAILED_PRECONDITION"
    assert "on this worker" in raised.value.message  # each names the fingerprint it serves


def test_identities_that_tie_at_build_are_an_error_unless_one_is_pinned(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    with (
        worker_process(tmp_path / "new", images(9)) as new,
        worker_process(tmp_path / "old", images(8)) as old,
    ):
        targets = [new.address("grpc"), old.address("grpc")]  # the new code listed first
        with pytest.raises(ValueError, match="split evenly between pipeline identities") as split:
            builder(targets).build()
        assert new.address("grpc") in str(split.value)
        assert old.address("grpc") in str(split.value)
        with builder([old.address("grpc")]).build() as reference:
            wanted = reference.identity.fingerprint
        with builder(targets).fingerprint(wanted[:12]).build() as loader:
            assert loader.identity.fingerprint == wanted
            assert loader.targets == [old.address("grpc")]
            assert new.address("grpc") in loader.stats().left_out


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_process_worker_starting_slowly_is_not_quarantined(
    tmp_path: pathlib.Path, transport: str
) -> None:
    # Its first answer waits for its loader processes to start and import (about 2 s here):
    # longer than the hang floor of 1 s that the quick worker's answers set.
    (tmp_path / "threads").mkdir()
    (tmp_path / "processes").mkdir()
    config = images(32, records=2000)
    with (
        worker_process(tmp_path / "threads", config, zmq=True) as quick,
        worker_process(tmp_path / "processes", config, zmq=True, args=["--processes", "2"]) as slow,
    ):
        # Not hedged: its first attempts wait for it (the quick worker's answers set the floor).
        targets = [quick.address(transport), slow.address(transport)]
        with builder(targets).hedge_after(None).build() as loader:
            assert len(list(loader)) == 500
            stats = loader.stats().workers[slow.address(transport)]
    # It was asked (its first attempts, given up at the hang floor, may lose to their re-issues
    # when its processes take longer than that to start)...
    assert stats.requests > 0
    # ... and none of that is held against it.
    assert stats.quarantined is None
    assert stats.failures == 0, stats.last_error


RAGGED = """
[pipelines.ragged]
factory = "failure_pipelines:ragged"
"""


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_batch_the_pipeline_cannot_make_raises_the_local_error_at_once(
    tmp_path: pathlib.Path, transport: str
) -> None:
    local = failure_pipelines.ragged()
    with pytest.raises(ValueError, match="pad_batcher") as expected:
        next(iter(DataLoader(local.batcher).batch_size(4).build(local.dataset)))
    with worker_processes(tmp_path, 2, RAGGED, zmq=True) as running:
        targets = [worker.address(transport) for worker in running]
        loader = RemoteDataLoader(targets, pipeline="ragged").batch_size(4).build()
        started = time.monotonic()
        with pytest.raises(ValueError, match="pad_batcher") as raised:
            next(iter(loader))
        waited = time.monotonic() - started
        loader.close()
    assert waited < 10.0, waited  # at once: not retried until no_worker_timeout
    assert str(raised.value) == str(expected.value)
    (note,) = raised.value.__notes__
    assert note.startswith("loadax: raised on ")
    assert "Traceback" in note


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_build_whose_every_target_refuses_fails_naming_the_cause(transport: str) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(WorkerError, match="connection refused") as raised:
        builder([f"{transport}://127.0.0.1:{port}"]).startup(timeout=300, give_up_after=2).build()
    waited = time.monotonic() - started
    assert waited < 60.0, waited  # about 4 s (give_up_after 2 s): never the start-up timeout
    assert f"{transport}://127.0.0.1:{port}" in raised.value.message


def test_a_build_through_the_wrong_transport_names_the_right_one(tmp_path: pathlib.Path) -> None:
    with worker_process(tmp_path, images(8)) as running:  # gRPC only
        wrong = running.address("grpc").replace("grpc://", "zmq://")
        with pytest.raises(WorkerError, match="speaks gRPC") as raised:
            builder([wrong]).startup(timeout=120, give_up_after=2).build()
    assert running.address("grpc") in raised.value.message


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_batch_too_large_for_the_worker_is_raised_at_once_asking_for_fewer_rows(
    tmp_path: pathlib.Path, transport: str
) -> None:
    # 8 rows of 256 KiB against a budget of 1 MiB: never back-pressure, never a quarantine.
    config = tmp_path / "worker.toml"
    config.write_text(
        '[server]\ngrpc = "127.0.0.1:0"\nzmq = "tcp://127.0.0.1:0"\nmemory_budget_mb = 1\n'
        '[pipelines.blobs]\nfactory = "pipelines:blobs"\n'
        "args = { records = 64, floats = 65536 }\n"
    )
    with worker_process(tmp_path, config=config) as running:
        target = running.address(transport)
        loader = RemoteDataLoader([target], pipeline="blobs").batch_size(8).build()
        started = time.monotonic()
        with pytest.raises(WorkerError, match="ask for fewer rows") as raised:
            next(iter(loader))
        waited = time.monotonic() - started
        stats = loader.stats().workers[target]
        loader.close()
    assert waited < 10.0, waited  # at once: not retried until no_worker_timeout
    assert raised.value.code == "INVALID_ARGUMENT"
    assert stats.quarantined is None
