"""RemoteDataLoader gives the local batches in every mode, transport and worker count."""

from __future__ import annotations

import gc
import json
import pathlib
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pipelines
import pytest
from equivalence import digests
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from jax.sharding import Mesh
from workers import WorkerProcess, worker_process, worker_processes, worker_with_settings

from loadax import DataLoader, WorkerError
from loadax.client import ClientSecurity, RemoteDataLoader
from loadax.server.worker import Worker

IMAGES = """
[pipelines.images]
factory = "pipelines:images"
args = { records = 40, side = 12 }
"""
OTHER_IMAGES = """
[pipelines.images]
factory = "pipelines:images"
args = { records = 40, side = 10 }
"""
BATCH, SEED, EPOCHS = 8, 5, 2


def local_loader() -> Any:
    pipeline = pipelines.images(records=40, side=12)
    return (
        DataLoader(pipeline.batcher)
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .num_epochs(EPOCHS)
        .workers(2)
        .build(pipeline.dataset)
    )


def remote_builder(targets: list[Any]) -> RemoteDataLoader:
    return (
        RemoteDataLoader(targets, pipeline="images")
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .num_epochs(EPOCHS)
        .prefetch(4)
    )


@pytest.fixture(scope="module")
def reference() -> list[str]:
    return digests(local_loader())


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    with worker_processes(tmp_path_factory.mktemp("workers"), 3, IMAGES, zmq=True) as running:
        yield running


def addresses(workers: list[WorkerProcess], transport: str, count: int) -> list[str]:
    chosen = [getattr(worker, transport) for worker in workers[:count]]
    assert all(chosen)
    return chosen


def test_in_process_workers_give_the_local_batches(reference: list[str]) -> None:
    worker = Worker({"images": pipelines.images(records=40, side=12)}, threads=2)
    with remote_builder([worker]).build() as loader:
        assert len(loader) == len(reference)
        assert digests(loader) == reference
    worker.close()


@pytest.mark.parametrize("shared_memory", [True, False])
@pytest.mark.parametrize("transport", ["grpc", "zmq"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_remote_workers_give_the_local_batches(
    workers: list[WorkerProcess],
    transport: str,
    count: int,
    shared_memory: bool,
    reference: list[str],
) -> None:
    builder = remote_builder(addresses(workers, transport, count)).shared_memory(shared_memory)
    gc.collect()  # other tests' batches still alive keep their memory files mapped
    before = memory_files()
    with builder.build() as loader:
        batches = list(loader)
        # Workers on this host write batches into the client's memory files, unless turned off.
        assert (memory_files() > before) == shared_memory
        assert digests(batches) == reference


def memory_files() -> int:
    """How many mappings of loadax memory files (loadax/wire/shared_memory.py) this process has."""
    return pathlib.Path("/proc/self/maps").read_text().count("/memfd:loadax-")


def test_grpc_and_zmq_targets_mix(workers: list[WorkerProcess], reference: list[str]) -> None:
    targets = [workers[0].grpc, workers[1].zmq, workers[2].grpc]
    with remote_builder(targets).build() as loader:
        assert digests(loader) == reference


def test_a_remote_iterator_restores_at_every_step(workers: list[WorkerProcess]) -> None:
    with remote_builder(addresses(workers, "zmq", 2)).build() as loader:
        assert_equal_output_after_checkpoint(loader)


def test_states_move_between_local_and_remote(workers: list[WorkerProcess]) -> None:
    local = iter(local_loader())
    for _ in range(3):
        next(local)
    state = json.loads(json.dumps(local.get_state()))
    with remote_builder(addresses(workers, "grpc", 2)).build() as loader:
        remote = iter(loader)
        remote.set_state(state)
        assert digests(remote) == digests(local)
        back = iter(loader)
        for _ in range(5):
            next(back)
        restored = iter(local_loader())
        restored.set_state(back.get_state())
        assert digests(restored) == digests(back)


def test_a_sharded_remote_loader_assembles_global_arrays(workers: list[WorkerProcess]) -> None:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    builder = remote_builder(addresses(workers, "zmq", 1)).shard(mesh, "data").device_prefetch(2)
    with builder.build() as loader:
        batches = list(loader)
    assert all(isinstance(leaf, jax.Array) for batch in batches for leaf in jax.tree.leaves(batch))
    assert_batches_equal(batches, local_loader())


def test_an_unknown_pipeline_is_refused_naming_both(workers: list[WorkerProcess]) -> None:
    with pytest.raises(WorkerError, match=r"NOT_FOUND: unknown pipeline 'videos'.*\['images'\]"):
        RemoteDataLoader(addresses(workers, "grpc", 1), pipeline="videos").batch_size(4).build()


def test_of_two_identities_that_tie_at_build_the_pinned_one_wins_in_any_order(
    workers: list[WorkerProcess], tmp_path: pathlib.Path, reference: list[str]
) -> None:
    # One target each: a tie, an error whatever the order; more targets agreeing win outright
    # (tests/test_fleet.py).
    with worker_process(tmp_path, OTHER_IMAGES) as other:
        for targets in ([workers[0].grpc, other.grpc], [other.grpc, workers[0].grpc]):
            with pytest.raises(ValueError, match="split evenly"):
                remote_builder(targets).build()
            with remote_builder([workers[0].grpc]).build() as alone:
                ours = alone.identity.fingerprint
            with remote_builder(targets).fingerprint(ours).build() as loader:
                assert loader.targets == [workers[0].grpc]
                assert list(loader.stats().left_out) == [other.grpc]
                assert digests(loader) == reference


def test_bad_targets_are_value_errors() -> None:
    with pytest.raises(ValueError, match="must start with grpc:// or zmq://"):
        RemoteDataLoader(["http://localhost:1"], pipeline="images").batch_size(2).build()
    with pytest.raises(ValueError, match="non-empty list"):
        RemoteDataLoader([], pipeline="images")
    with pytest.raises(ValueError, match="non-empty list"):
        RemoteDataLoader("grpc://localhost:1", pipeline="images")
    with pytest.raises(ValueError, match="address or a worker object"):
        RemoteDataLoader([42], pipeline="images").batch_size(2).build()  # type: ignore[list-item]


def test_a_token_guarded_worker_serves_a_loader_that_carries_the_token(
    tmp_path: pathlib.Path, reference: list[str]
) -> None:
    token = "remote-loader-token-0123456789"
    (tmp_path / "token").write_text(token)
    with worker_with_settings(tmp_path, 'token_file = "token"', IMAGES, zmq=True) as guarded:
        with pytest.raises(WorkerError, match="UNAUTHENTICATED"):
            remote_builder([guarded.grpc]).build()
        for target in (guarded.grpc, guarded.zmq):
            builder = RemoteDataLoader(
                [target], pipeline="images", security=ClientSecurity(token=token)
            )
            builder = builder.batch_size(BATCH).shuffle(seed=SEED).num_epochs(EPOCHS)
            with builder.build() as loader:
                assert digests(loader) == reference


def test_a_consumed_batch_is_freed_at_once() -> None:
    # Neither a pending deadline (an hour away here) nor a reference cycle that only the garbage
    # collector would break may keep a batch that was answered and consumed alive.
    worker = Worker({"numbers": pipelines.numbers()}, threads=1)
    gc.disable()
    try:
        builder = RemoteDataLoader([worker], pipeline="numbers").batch_size(10).hedge_after(3000)
        with builder.request_timeout(3600).build() as loader:
            freed = []
            for batch in loader:
                freed.append(weakref.ref(batch["x"]))
            del batch
            assert len(freed) == 10
            assert [ref() is None for ref in freed] == [True] * 10
    finally:
        gc.enable()
        worker.close()
