"""Nothing lost: dead, hung, restarted, added and removed workers leave the batches unchanged."""

from __future__ import annotations

import pathlib
from typing import Any

import pipelines
import pytest
from equivalence import digests
from processes import free_port
from workers import stopped, worker_process, worker_processes

from loadax import DataLoader, WorkerError
from loadax.client import RemoteDataLoader

RECORDS, BATCH, SEED = 96, 4, 11
IMAGES = f"""
[pipelines.images]
factory = "pipelines:images"
args = {{ records = {RECORDS}, side = 8 }}
"""


@pytest.fixture(scope="module")
def reference() -> list[str]:
    pipeline = pipelines.images(records=RECORDS, side=8)
    loader = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(0)
    return digests(loader.build(pipeline.dataset))


def builder(targets: list[Any], **failover: float | None) -> RemoteDataLoader:
    loader = (
        RemoteDataLoader(targets, pipeline="images")
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .prefetch(6)
    )
    for option, value in failover.items():
        loader = getattr(loader, option)(value)
    return loader


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_worker_killed_mid_epoch_loses_nothing(
    tmp_path: pathlib.Path, transport: str, reference: list[str]
) -> None:
    with worker_processes(tmp_path, 3, IMAGES, zmq=True) as running:
        targets = [worker.address(transport) for worker in running]
        with builder(targets, request_timeout=30).build() as loader:
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(5)]
            running[1].process.kill()  # kill -9, with requests in flight on it
            seen += list(iterator)
    assert digests(seen) == reference


def test_a_hung_worker_is_passed_over_at_the_deadline(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    with worker_processes(tmp_path, 3, IMAGES) as running:
        targets = [worker.address("grpc") for worker in running]
        with builder(targets, request_timeout=1.0).build() as loader, stopped(running[0]):
            batches = digests(loader)
    assert batches == reference


def test_a_slow_worker_is_hedged_before_its_deadline(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    with worker_processes(tmp_path, 2, IMAGES) as running:
        targets = [worker.address("grpc") for worker in running]
        # The deadline never comes within the test: only hedging can get past the stopped worker.
        with (
            builder(targets, request_timeout=3600, hedge_after=0.2).build() as loader,
            stopped(running[0]),
        ):
            batches = digests(loader)
    assert batches == reference


def test_a_worker_restarted_on_its_address_is_used_again(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    port = free_port()
    pinned = ["--grpc", f"127.0.0.1:{port}"]
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    (tmp_path / "helper").mkdir()
    with worker_process(tmp_path / "helper", IMAGES) as helper:
        with worker_process(tmp_path / "first", IMAGES, args=pinned) as first:
            loader = builder([f"grpc://127.0.0.1:{port}", helper.address("grpc")]).build()
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(4)]
            first.process.kill()
            first.process.wait()
        with worker_process(tmp_path / "second", IMAGES, args=pinned):
            # Only the restarted worker is left: the rest must come from it.
            loader.remove_target(helper.address("grpc"))
            seen += list(iterator)
            assert loader.targets == [f"grpc://127.0.0.1:{port}"]
        loader.close()
    assert digests(seen) == reference


def test_workers_added_and_removed_mid_epoch_change_nothing(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    with (
        worker_processes(tmp_path, 3, IMAGES, zmq=True) as running,
        builder([running[0].address("grpc")]).build() as loader,
    ):
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(3)]
        loader.add_target(running[1].address("zmq"))
        loader.add_target(running[2].address("grpc"))
        seen += [next(iterator) for _ in range(6)]
        loader.remove_target(running[0].address("grpc"))
        seen += list(iterator)
        assert sorted(loader.targets) == sorted(
            [running[1].address("zmq"), running[2].address("grpc")]
        )
    assert digests(seen) == reference


def test_a_name_listing_several_addresses_is_looked_up_again(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    port = free_port()
    listed = ["127.0.0.1"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        worker_process(tmp_path / "a", IMAGES, args=["--grpc", f"127.0.0.1:{port}"]),
        worker_process(tmp_path / "b", IMAGES, args=["--grpc", f"127.0.0.2:{port}"]),
    ):
        loader = RemoteDataLoader(
            [f"grpc://workers.test:{port}"], pipeline="images", resolver=lambda host: list(listed)
        )
        with loader.batch_size(BATCH).shuffle(seed=SEED).build() as remote:
            assert remote.targets == [f"grpc://127.0.0.1:{port}"]
            iterator = iter(remote)
            seen = [next(iterator) for _ in range(3)]
            listed[:] = ["127.0.0.1", "127.0.0.2"]
            remote.refresh()
            assert sorted(remote.targets) == [f"grpc://127.0.0.{i}:{port}" for i in (1, 2)]
            seen += [next(iterator) for _ in range(3)]
            listed[:] = ["127.0.0.2"]
            remote.refresh()
            assert remote.targets == [f"grpc://127.0.0.2:{port}"]
            seen += list(iterator)
    assert digests(seen) == reference


def test_with_no_worker_left_iteration_fails_naming_every_target(tmp_path: pathlib.Path) -> None:
    with worker_processes(tmp_path, 2, IMAGES) as running:
        targets = [worker.address("grpc") for worker in running]
        loader = builder(targets, no_worker_timeout=2.0).build()
        iterator = iter(loader)
        next(iterator)
        for worker in running:
            worker.process.kill()
            worker.process.wait()
        # Whichever clock runs out first: the fleet's silence since its last answer, or the
        # failures of the request at the front since its first (answers already received may
        # be told after the first failure).
        dead = r"UNAVAILABLE: (no worker answered|every worker failed step \d+) for 2 s"
        with pytest.raises(WorkerError, match=dead) as error:
            list(iterator)
        for target in targets:
            assert f"{target} (UNAVAILABLE" in error.value.message
        loader.close()


def test_a_worker_back_within_the_timeout_lets_iteration_continue(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    port = free_port()
    pinned = ["--grpc", f"127.0.0.1:{port}"]
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    with worker_process(tmp_path / "before", IMAGES, args=pinned) as before:
        loader = builder([f"grpc://127.0.0.1:{port}"], no_worker_timeout=120).build()
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(2)]
        before.process.kill()
        before.process.wait()
    with worker_process(tmp_path / "after", IMAGES, args=pinned):
        seen += list(iterator)
    loader.close()
    assert digests(seen) == reference
