"""One process of a real multi-process JAX job, started by tests/test_checkpoint.py.

Every process saves a sharded model and its own loader iterator with one Orbax CheckpointManager
into a shared directory, then restores both into fresh objects and checks that the next global
batches are the uninterrupted run's. With `--single`, it also restores a checkpoint that one
process saved: every process then reads process 0's state.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import traceback
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from loadax import Batcher, DataLoader, Loader, RangeDataset
from loadax.delivery.meshes import ddp_sharding
from loadax.state.checkpoint import LoaderRestore, LoaderSave

GLOBAL_BATCH = 16
RECORDS = 56  # 3 full batches per epoch, 8 records dropped
EPOCHS = 2
STEPS = 6
SAVE_AT = 2
SINGLE_SAVE_AT = 4


def make_record(index: int, rng: np.random.Generator) -> dict[str, Any]:
    return {"x": rng.normal(size=3).astype(np.float32) + index, "id": np.int64(index)}


DATASET = RangeDataset(0, RECORDS).random_map(make_record, seed=1)


def builder() -> DataLoader[Any, Any]:
    return (
        DataLoader(Batcher())
        .batch_size(GLOBAL_BATCH)
        .shuffle(seed=3)
        .num_epochs(EPOCHS)
        .drop_remainder()
        .workers(2)
    )


def save(loader: Loader[Any], directory: pathlib.Path, step: int) -> None:
    """Advance an iterator of `loader` by `step` batches and save it with a manager."""
    with ocp.CheckpointManager(directory) as manager, iter(loader) as iterator:
        for _ in range(step):
            next(iterator)
        manager.save(step, args=ocp.args.Composite(loader=LoaderSave(iterator)))
        manager.wait_until_finished()


def model_at(step: int) -> jax.Array:
    """A model array sharded over every device of every process, different at every step."""
    mesh, _ = ddp_sharding()
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    values = np.arange(2 * jax.device_count(), dtype=np.float32) + step
    return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])


def gathered(loader: Loader[Any], iterator: Any) -> list[Any]:
    strategy = loader.sharding_strategy
    return [
        multihost_utils.process_allgather(strategy.distribute_global_batch(local), tiled=True)
        for local in iterator
    ]


def check_rest(loader: Loader[Any], iterator: Any, start: int, where: str) -> None:
    """The global batches of `iterator` are the uninterrupted run's from step `start` on."""
    whole = builder().build(DATASET)  # unsharded: every row of every global batch
    reference = [whole.pipeline.load(whole.plan, step) for step in range(STEPS)]
    rest = gathered(loader, iterator)
    assert len(rest) == STEPS - start, (where, len(rest))
    for offset, batch in enumerate(rest):
        for name in ("x", "id"):
            np.testing.assert_array_equal(
                np.asarray(batch[name]), reference[start + offset][name], err_msg=where
            )


def run(args: argparse.Namespace) -> None:
    mesh, _ = ddp_sharding()
    loader = builder().shard(mesh, "data").build(DATASET)
    assert len(loader) == STEPS
    directory = pathlib.Path(args.directory)
    index, count = jax.process_index(), jax.process_count()

    with ocp.CheckpointManager(directory) as manager, iter(loader) as iterator:
        for _ in range(SAVE_AT):
            next(iterator)
        manager.save(
            SAVE_AT,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave({"w": model_at(SAVE_AT)}),
                loader=LoaderSave(iterator),
            ),
        )
        next(iterator)  # the loop moves on while the checkpoint is written
        manager.wait_until_finished()
    multihost_utils.sync_global_devices("saved")
    assert (directory / str(SAVE_AT) / "loader" / f"process_{index}.json").exists()
    print(f"ok process {index} of {count} saved at step {SAVE_AT}", flush=True)

    with ocp.CheckpointManager(directory) as manager:
        fresh = iter(loader)
        restored = manager.restore(
            SAVE_AT,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore({"w": model_at(0)}),
                loader=LoaderRestore(fresh),
            ),
        )
    expected = multihost_utils.process_allgather(model_at(SAVE_AT), tiled=True)
    np.testing.assert_array_equal(
        multihost_utils.process_allgather(restored.model["w"], tiled=True), expected
    )
    with fresh:
        check_rest(loader, fresh, SAVE_AT, "resumed")
    print(f"ok resumed {STEPS - SAVE_AT} steps", flush=True)

    if args.single:
        with ocp.CheckpointManager(args.single) as manager:
            fresh = iter(loader)
            manager.restore(SINGLE_SAVE_AT, args=ocp.args.Composite(loader=LoaderRestore(fresh)))
        with fresh:
            check_rest(loader, fresh, SINGLE_SAVE_AT, "resumed from 1 process")
        print(f"ok resumed {STEPS - SINGLE_SAVE_AT} steps from 1 process", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--directory", required=True)
    parser.add_argument("--single")
    args = parser.parse_args()
    jax.distributed.initialize(
        args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
    )
    try:
        run(args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        # Exiting normally would wait in jax.distributed's shutdown barrier for the others.
        os._exit(1)


if __name__ == "__main__":
    main()
