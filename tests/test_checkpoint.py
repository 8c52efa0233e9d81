"""loadax.state.checkpoint with the real Orbax: a CheckpointManager resumes iterators exactly."""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import multihost_orbax_check as check
import numpy as np
import orbax.checkpoint as ocp
import pipelines
import pytest
from helpers import assert_batches_equal
from jax.sharding import Mesh
from processes import run_jax_processes
from workers import WorkerProcess, worker_processes

from loadax import Batcher, DataLoader, Loader, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.state.checkpoint import LoaderCheckpointHandler, LoaderRestore, LoaderSave

IMAGES = """
[pipelines.images]
factory = "pipelines:images"
args = { records = 40, side = 8 }
"""
BATCH, SEED, EPOCHS = 8, 5, 2  # 10 steps: 5 per epoch, shuffled differently in each
MULTIHOST_CHECK = pathlib.Path(__file__).parent / "multihost_orbax_check.py"


def model_at(step: int) -> dict[str, jax.Array]:
    """A small model state that differs at every step, so a wrong step cannot pass."""
    return {"w": jnp.full((2, 3), step, jnp.float32), "b": jnp.arange(3, dtype=jnp.int32) + step}


def local_loader(
    seed: int = SEED, workers: int = 2, mesh: Mesh | None = None, device_prefetch: int = 0
) -> Loader[Any]:
    pipeline = pipelines.images(records=40, side=8)
    builder = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=seed).num_epochs(EPOCHS)
    builder = builder.workers(workers).prefetch(3) if workers else builder.workers(0)
    if mesh is not None:
        builder = builder.shard(mesh, "data").device_prefetch(device_prefetch)
    return builder.build(pipeline.dataset)


def stop_points(count: int, steps: int, seed: int) -> list[int]:
    """`count` distinct seeded-random steps in [0, steps], where a training run may stop."""
    rng = np.random.default_rng(seed)
    return sorted(int(step) for step in rng.choice(steps + 1, size=count, replace=False))


def train_and_save(loader: Loader[Any], directory: pathlib.Path, stops: list[int]) -> list[Any]:
    """Run `loader` to the end like a training loop that checkpoints at `stops`; every batch.

    Saves are asynchronous and the loop moves on at once, so the saved state must be the one of
    the moment of `save`, not of when the write happens.
    """
    batches = []
    with ocp.CheckpointManager(directory) as manager, iter(loader) as iterator:
        for step in range(len(loader) + 1):
            if step in stops:
                state = iterator.get_state()
                args = ocp.args.Composite(
                    model=ocp.args.StandardSave(model_at(step)), loader=LoaderSave(iterator)
                )
                assert manager.save(step, args=args)
                assert iterator.get_state() == state  # saving does not move the iterator
            if step < len(loader):
                batches.append(next(iterator))
        manager.wait_until_finished()
        assert manager.all_steps() == stops
    return batches


def restore(loader: Loader[Any], directory: pathlib.Path, step: int) -> tuple[Any, list[Any]]:
    """The model and the remaining batches of a fresh iterator restored from `step`."""
    with ocp.CheckpointManager(directory) as manager:
        fresh = iter(loader)
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(model_at(0)), loader=LoaderRestore(fresh)
            ),
        )
    assert restored.loader is fresh
    assert fresh.get_state()["step"] == step
    with fresh:
        return restored.model, list(fresh)


def assert_resumes(
    save_with: Loader[Any],
    restore_with: Loader[Any],
    directory: pathlib.Path,
    stops: list[int],
    expected: list[Any],
) -> None:
    """Saving at `stops` with one loader, then restoring each stop with the other, gives the
    model of that step and exactly the rest of the uninterrupted run."""
    assert_batches_equal(train_and_save(save_with, directory, stops), expected)
    for step in stops:
        state = json.loads((directory / str(step) / "loader" / "process_0.json").read_text())
        assert state["step"] == step
        model, rest = restore(restore_with, directory, step)
        assert_batches_equal([model], [model_at(step)])
        assert_batches_equal(rest, expected[step:])


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    return list(local_loader())


@pytest.mark.parametrize("kind", ["threads", "inline", "device_prefetch"])
def test_a_local_iterator_resumes_from_a_checkpoint_manager_at_random_stops(
    kind: str, reference: list[Any], tmp_path: pathlib.Path
) -> None:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    make: dict[str, Callable[[], Loader[Any]]] = {
        "threads": local_loader,
        "inline": lambda: local_loader(workers=0),
        "device_prefetch": lambda: local_loader(mesh=mesh, device_prefetch=2),
    }
    loader = make[kind]()
    stops = stop_points(5, len(loader), seed=len(kind))
    assert_resumes(loader, make[kind](), tmp_path, stops, reference)


def test_restoring_into_an_iterator_that_ran_ahead_rewinds_it(
    reference: list[Any], tmp_path: pathlib.Path
) -> None:
    loader = local_loader()
    train_and_save(loader, tmp_path, [3])
    with ocp.CheckpointManager(tmp_path) as manager, iter(loader) as iterator:
        for _ in range(7):
            next(iterator)
        manager.restore(3, args=ocp.args.Composite(loader=LoaderRestore(iterator)))
        assert_batches_equal(iterator, reference[3:])


def test_restore_without_an_iterator_returns_the_saved_state(tmp_path: pathlib.Path) -> None:
    loader = local_loader()
    train_and_save(loader, tmp_path, [4])
    with ocp.CheckpointManager(tmp_path) as manager:
        state = manager.restore(4, args=ocp.args.Composite(loader=LoaderRestore())).loader
    expected = {"step": 4, "plan": loader.plan.describe(), "fingerprint": loader.fingerprint()}
    position = loader.plan.position(4).describe()
    assert state == {"version": 2, **expected, "position": position}


def test_a_state_of_another_plan_is_rejected(tmp_path: pathlib.Path) -> None:
    train_and_save(local_loader(seed=SEED), tmp_path, [2])
    with ocp.CheckpointManager(tmp_path) as manager, iter(local_loader(seed=9)) as other:
        args = ocp.args.Composite(loader=LoaderRestore(other))
        with pytest.raises(ValueError, match="another plan: seed is 5 in the state but 9"):
            manager.restore(2, args=args)


def doubling_loader(factor: int, device_prefetch: int | None = None) -> Loader[Any]:
    """Batches of 2 records, each `factor` times its index: its code changes with `factor`."""
    scale = (lambda x: 2 * x) if factor == 2 else (lambda x: 3 * x)
    builder = DataLoader(Batcher()).batch_size(2)
    if device_prefetch is not None:
        builder = builder.device_prefetch(device_prefetch)
    return builder.build(RangeDataset(0, 8).map(scale))


@pytest.mark.parametrize("device_prefetch", [None, 2])
def test_a_state_of_another_pipeline_is_refused_unless_allowed(
    device_prefetch: int | None,
) -> None:
    doubled = doubling_loader(2, device_prefetch)
    tripled = doubling_loader(3, device_prefetch)
    with iter(doubled) as iterator:
        next(iterator)
        state = json.loads(json.dumps(iterator.get_state()))
    assert state["fingerprint"] == doubled.fingerprint() != tripled.fingerprint()
    with iter(tripled) as resumed:
        short = (doubled.fingerprint()[:12], tripled.fingerprint()[:12])
        expected = rf"pipeline {short[0]}\.\.\., .* is {short[1]}\.\.\. .*allow_new_pipeline=True"
        with pytest.raises(ValueError, match=expected):
            resumed.set_state(state)
        assert resumed.step == 0  # nothing moved
        resumed.set_state(state, allow_new_pipeline=True)
        assert [np.asarray(batch).tolist() for batch in resumed] == [[6, 9], [12, 15], [18, 21]]
    # A state saved before fingerprints (version 1) restores into any pipeline.
    old = {key: state[key] for key in ("step", "plan")}
    with iter(tripled) as resumed:
        resumed.set_state({"version": 1, **old})
        assert resumed.step == 1


def test_orbax_refuses_a_state_of_another_pipeline_unless_allowed(tmp_path: pathlib.Path) -> None:
    with iter(doubling_loader(2)) as iterator:
        next(iterator)
        LoaderCheckpointHandler().save(tmp_path, LoaderSave(iterator))
    handler, tripled = LoaderCheckpointHandler(), doubling_loader(3)
    with pytest.raises(ValueError, match="allow_new_pipeline=True"):
        handler.restore(tmp_path, LoaderRestore(iter(tripled)))
    resumed = handler.restore(tmp_path, LoaderRestore(iter(tripled), allow_new_pipeline=True))
    assert [np.asarray(batch).tolist() for batch in resumed] == [[6, 9], [12, 15], [18, 21]]
    with pytest.raises(ValueError, match="LoaderRestore's allow_new_pipeline must be a bool"):
        LoaderRestore(iter(tripled), allow_new_pipeline="yes")  # type: ignore[arg-type]


def test_a_missing_directory_or_file_is_named(tmp_path: pathlib.Path) -> None:
    handler = LoaderCheckpointHandler()
    iterator = iter(local_loader())
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"no loadax iterator checkpoint at {missing}"):
        handler.restore(missing, LoaderRestore(iterator))
    (tmp_path / "other.txt").write_text("")
    with pytest.raises(FileNotFoundError, match=r"neither process_0.json .*\['other.txt'\]"):
        handler.restore(tmp_path, LoaderRestore(iterator))
    (tmp_path / "process_0.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"process_0\.json is not a loadax iterator state"):
        handler.restore(tmp_path, LoaderRestore(iterator))
    (tmp_path / "process_0.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"process_0\.json holds a list"):
        handler.restore(tmp_path, LoaderRestore())
    iterator.close()


def test_the_state_file_is_written_atomically(tmp_path: pathlib.Path) -> None:
    with iter(local_loader()) as iterator:
        next(iterator)
        LoaderCheckpointHandler().save(tmp_path, LoaderSave(iterator))
        assert [path.name for path in tmp_path.iterdir()] == ["process_0.json"]
        assert json.loads((tmp_path / "process_0.json").read_text()) == iterator.get_state()


def test_args_refuse_what_is_not_a_loadax_iterator() -> None:
    loader = local_loader()
    with pytest.raises(TypeError, match=r"LoaderSave needs a loadax iterator .*got Loader"):
        LoaderSave(loader)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"LoaderRestore needs a loadax iterator .*got list"):
        LoaderRestore([])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    with worker_processes(tmp_path_factory.mktemp("workers"), 2, IMAGES, zmq=True) as running:
        yield running


@contextlib.contextmanager
def opened(kind: str, workers: list[WorkerProcess]) -> Iterator[Loader[Any]]:
    """A loader: "local", or "<transport> x<workers>" for a remote loader of that many workers."""
    if kind == "local":
        yield local_loader()
        return
    transport, count = kind.split(" x")
    targets = [getattr(worker, transport) for worker in workers[: int(count)]]
    builder = RemoteDataLoader(targets, pipeline="images")
    builder = builder.batch_size(BATCH).shuffle(seed=SEED).num_epochs(EPOCHS).prefetch(4)
    with builder.build() as loader:
        yield loader


@pytest.mark.parametrize(
    ("saved_by", "restored_by"),
    [("zmq x2", "grpc x1"), ("grpc x2", "zmq x1"), ("local", "zmq x2"), ("grpc x2", "local")],
)
def test_a_checkpoint_moves_between_worker_counts_transports_and_local_loading(
    saved_by: str,
    restored_by: str,
    workers: list[WorkerProcess],
    reference: list[Any],
    tmp_path: pathlib.Path,
) -> None:
    stops = stop_points(3, len(reference), seed=len(saved_by + restored_by))
    with opened(saved_by, workers) as saver, opened(restored_by, workers) as restorer:
        assert_resumes(saver, restorer, tmp_path, stops, reference)


def test_every_jax_process_saves_its_own_state_and_resumes(tmp_path: pathlib.Path) -> None:
    # A checkpoint of one process, restored by two: process 1 falls back to process 0's file.
    single = tmp_path / "single"
    check.save(check.builder().build(check.DATASET), single, check.SINGLE_SAVE_AT)

    shared = tmp_path / "shared"
    outputs = run_jax_processes(
        MULTIHOST_CHECK, 2, 4, f"--directory={shared}", f"--single={single}"
    )
    for index, output in enumerate(outputs):
        assert f"ok process {index} of 2 saved at step {check.SAVE_AT}" in output, output
        assert f"ok resumed {check.STEPS - check.SAVE_AT} steps" in output, output
        assert f"ok resumed {check.STEPS - check.SINGLE_SAVE_AT} steps from 1 process" in output
    item = shared / str(check.SAVE_AT) / "loader"
    assert sorted(path.name for path in item.glob("*.json")) == ["process_0.json", "process_1.json"]
    states = [json.loads((item / f"process_{index}.json").read_text()) for index in (0, 1)]
    assert states[0] == states[1]
    assert states[0]["step"] == check.SAVE_AT
    single_item = single / str(check.SINGLE_SAVE_AT) / "loader"
    assert [path.name for path in single_item.glob("*.json")] == ["process_0.json"]


def test_a_stream_restores_from_the_cursors_of_every_process_file(tmp_path: pathlib.Path) -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    stream = pipelines.numbers(60).dataset.filter(lambda record: bool(record["y"] % 3))
    loader = DataLoader(pipelines.numbers().batcher).batch_size(4).shard(mesh, "data").build(stream)
    expected = list(loader)
    with iter(loader) as iterator:
        for _ in range(3):
            next(iterator)
        state = iterator.get_state()
    # As two processes reading one data shard each would have saved it.
    cursors = state["stream"]["cursors"]
    assert set(cursors) == {"0", "1"}
    for process, shard in enumerate(("1", "0")):
        own = {**state, "stream": {**state["stream"], "cursors": {shard: cursors[shard]}}}
        (tmp_path / f"process_{process}.json").write_text(json.dumps(own))
    with iter(loader) as restored:
        LoaderCheckpointHandler().restore(tmp_path, LoaderRestore(restored))
        assert_batches_equal(restored, expected[3:])
    later = {**json.loads((tmp_path / "process_1.json").read_text()), "step": 4}
    (tmp_path / "process_1.json").write_text(json.dumps(later))
    with (
        iter(loader) as restored,
        pytest.raises(ValueError, match="stream states differ: step 4 and 3"),
    ):
        LoaderCheckpointHandler().restore(tmp_path, LoaderRestore(restored))
