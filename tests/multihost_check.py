"""One process of a real multi-process JAX job, started by tests/test_multihost.py.

For several meshes it loads this process's rows of every step, assembles global jax.Arrays,
gathers them with a collective and checks they equal the single-process reference batches.
Process 0 prints a digest of everything gathered, so that topologies can be compared; the
same for a filtered stream, whose data shards each read a stream of their own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from loadax import Batcher, DataLoader, RangeDataset
from loadax.delivery.meshes import ddp_sharding, devices_by_process, fsdp_sharding

GLOBAL_BATCH = 16
RECORDS = 56  # 3 full batches per epoch, 8 records dropped
EPOCHS = 2
SAVE_AFTER = 2


def make_record(index: int, rng: np.random.Generator) -> dict[str, Any]:
    return {"x": rng.normal(size=3).astype(np.float32) + index, "id": np.int64(index)}


def builder(workers: int = 2) -> DataLoader[Any, Any]:
    loader = (
        DataLoader(Batcher())
        .batch_size(GLOBAL_BATCH)
        .shuffle(seed=3)
        .num_epochs(EPOCHS)
        .drop_remainder()
        .workers(workers)
    )
    return loader.prefetch(2) if workers else loader


DATASET = RangeDataset(0, RECORDS).random_map(make_record, seed=1)
STREAM = DATASET.filter(lambda record: bool(record["id"] % 3 != 0))
STREAM_STEPS = 6  # the stream repeats forever: shards would run out at different steps


def meshes() -> dict[str, tuple[Mesh, str | tuple[str, ...], Callable[[int], int]]]:
    """Scenario -> (mesh, data axis, rows this process must load for a global batch)."""
    grid = devices_by_process()  # (process, local device)
    processes = grid.shape[0]
    ddp_mesh, _ = ddp_sharding()
    fsdp_mesh, _ = fsdp_sharding()

    def own_share(batch: int) -> int:
        return batch // processes

    def everything(batch: int) -> int:
        return batch

    return {
        "ddp": (ddp_mesh, "data", own_share),
        "fsdp": (fsdp_mesh, "data", own_share),
        # Device order interleaves processes along the data axis: non-contiguous rows.
        "interleaved": (Mesh(grid.T.reshape(-1), ("data",)), "data", own_share),
        # Each data row is held by one device of every process: all processes load all rows.
        "model_across_processes": (Mesh(grid.T, ("data", "model")), "data", everything),
        "data_and_model": (Mesh(grid.reshape(-1, 2), ("data", "model")), "data", own_share),
        "tuple_axes": (
            Mesh(grid.reshape(2, -1), ("replica", "data")),
            ("replica", "data"),
            own_share,
        ),
    }


def reference_batches() -> list[Any]:
    """Every global batch, loaded whole by this process alone."""
    loader = builder(workers=0).build(DATASET)
    return [loader.pipeline.load(loader.plan, step) for step in range(len(loader))]


def check_equal(gathered: Any, expected: Any, where: str) -> None:
    for name in ("x", "id"):
        np.testing.assert_array_equal(np.asarray(gathered[name]), expected[name], err_msg=where)


def run(args: argparse.Namespace) -> None:
    reference = reference_batches()
    digest = hashlib.sha256()
    for name, (mesh, axis, expected_rows) in meshes().items():
        loader = builder().shard(mesh, data_axis_name=axis).build(DATASET)
        strategy = loader.sharding_strategy
        with iter(loader) as iterator:
            for step, local in enumerate(iterator):
                assert len(local["id"]) == expected_rows(GLOBAL_BATCH), (name, len(local["id"]))
                batch = strategy.distribute_global_batch(local)
                assert batch["x"].shape == (GLOBAL_BATCH, 3)
                assert batch["x"].sharding == strategy.sharding
                gathered = multihost_utils.process_allgather(batch, tiled=True)
                check_equal(gathered, reference[step], f"{name} step {step}")
                for leaf in (gathered["x"], gathered["id"]):
                    digest.update(np.ascontiguousarray(leaf).tobytes())
        print(f"ok {name}: {len(reference)} steps", flush=True)

    ddp_mesh, _ = ddp_sharding()
    fsdp_mesh, _ = fsdp_sharding()
    device_loader = builder().shard(ddp_mesh, "data").device_prefetch(2).build(DATASET)
    for step, batch in enumerate(device_loader):
        assert isinstance(batch["x"], jax.Array)
        check_equal(multihost_utils.process_allgather(batch, tiled=True), reference[step], "device")
    print("ok device_prefetch", flush=True)

    if args.save_state and jax.process_index() == 0:
        iterator = iter(builder().shard(ddp_mesh, "data").build(DATASET))
        for _ in range(SAVE_AFTER):
            next(iterator)
        pathlib.Path(args.save_state).write_text(json.dumps(iterator.get_state()))
        iterator.close()
    if args.restore_state:
        # Restored under another topology and another mesh than the one that saved it.
        restore_loader = builder().shard(fsdp_mesh, "data").build(DATASET)
        iterator = iter(restore_loader)
        iterator.set_state(json.loads(pathlib.Path(args.restore_state).read_text()))
        strategy = restore_loader.sharding_strategy
        restored = [
            multihost_utils.process_allgather(strategy.distribute_global_batch(local), tiled=True)
            for local in iterator
        ]
        assert len(restored) == len(reference) - SAVE_AFTER
        for offset, gathered in enumerate(restored):
            check_equal(gathered, reference[SAVE_AFTER + offset], f"restored {offset}")
        print(f"ok restored {len(restored)} steps", flush=True)
    if jax.process_index() == 0:
        print(f"digest {digest.hexdigest()}", flush=True)
    check_stream(args)


def stream_digests(iterator: Any, strategy: Any, steps: int) -> list[str]:
    """A digest of each gathered global batch of the next `steps` steps of a stream."""
    digests = []
    for _ in range(steps):
        global_batch = strategy.distribute_global_batch(next(iterator))
        gathered = multihost_utils.process_allgather(global_batch, tiled=True)
        digest = hashlib.sha256()
        for name in ("x", "id"):
            digest.update(np.ascontiguousarray(gathered[name]).tobytes())
        digests.append(digest.hexdigest())
    return digests


def check_stream(args: argparse.Namespace) -> None:
    """The same global stream batches in every topology (8 data shards in each), and a state
    saved by one process holding every shard restores in processes holding some of them."""
    ddp_mesh, _ = ddp_sharding()
    loader = builder().num_epochs(None).shard(ddp_mesh, "data").build(STREAM)
    with iter(loader) as iterator:
        digests = stream_digests(iterator, loader.sharding_strategy, STREAM_STEPS)
    print(f"ok stream: {len(digests)} steps", flush=True)
    if args.save_state and jax.process_index() == 0:
        iterator = iter(loader)
        for _ in range(SAVE_AFTER):
            next(iterator)
        pathlib.Path(f"{args.save_state}.stream").write_text(json.dumps(iterator.get_state()))
        iterator.close()
    if args.restore_state:
        with iter(loader) as iterator:
            iterator.set_state(json.loads(pathlib.Path(f"{args.restore_state}.stream").read_text()))
            restored = stream_digests(iterator, loader.sharding_strategy, STREAM_STEPS - SAVE_AFTER)
        assert restored == digests[SAVE_AFTER:], "restored stream batches differ"
        print(f"ok stream restored {len(restored)} steps", flush=True)
    if jax.process_index() == 0:
        print(f"stream digest {hashlib.sha256(''.join(digests).encode()).hexdigest()}", flush=True)


def launch(
    run: Callable[[argparse.Namespace], None],
    description: str | None,
    more_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
) -> None:
    """One process of a job: join it (`jax.distributed`, when there are several), then `run`
    with the arguments every check takes (its place in the job, a state to save or restore)
    and those `more_arguments` adds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--save-state")
    parser.add_argument("--restore-state")
    more_arguments(parser)
    args = parser.parse_args()
    if args.num_processes > 1:
        jax.distributed.initialize(
            args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=60,
        )
    run(args)


if __name__ == "__main__":
    launch(run, __doc__)
