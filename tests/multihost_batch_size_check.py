"""One process of a real multi-process JAX job, started by tests/test_batch_sizes.py.

With `--save-state`, it loads the first `SAVE_AT` global batches of a loader with a batch-size
schedule, and writes the iterator's state (process 0). With `--restore-state`, a loader of
another schedule restores that state with `allow_new_batch_size=True` and loads the rest. Each
global batch is gathered with a collective; process 0 prints the ids of every one as JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from multihost_check import launch

from loadax import Batcher, DataLoader, RangeDataset
from loadax.delivery.meshes import ddp_sharding

RECORDS = 56
SAVE_AT = 3
SAVED_SCHEDULE = [(0, 16), (2, 8)]  # epoch 0: 16, 16, then 8s
RESUMED_SCHEDULE = [(0, 24), (5, 8)]  # from step 3: the 16 left of epoch 0, then 24, then 8s


def make_record(index: int, rng: np.random.Generator) -> dict[str, Any]:
    return {"x": rng.normal(size=3).astype(np.float32) + index, "id": np.int64(index)}


DATASET = RangeDataset(0, RECORDS).random_map(make_record, seed=1)


def builder(schedule: list[tuple[int, int]]) -> DataLoader[Any, Any]:
    return DataLoader(Batcher()).batch_size_schedule(schedule).shuffle(seed=5).num_epochs(2)


def run(args: argparse.Namespace) -> None:
    mesh, _ = ddp_sharding()
    schedule = SAVED_SCHEDULE if args.save_state else RESUMED_SCHEDULE
    loader = builder(schedule).shard(mesh, "data").device_prefetch(1).build(DATASET)
    iterator = iter(loader)
    if args.restore_state:
        state = json.loads(pathlib.Path(args.restore_state).read_text())
        iterator.set_state(state, allow_new_batch_size=True)
    batches = []
    for batch in iterator:
        gathered = multihost_utils.process_allgather(batch, tiled=True)
        batches.append({name: np.asarray(leaf).tolist() for name, leaf in gathered.items()})
        if args.save_state and len(batches) == SAVE_AT:
            break
    if jax.process_index() == 0:
        if args.save_state:
            pathlib.Path(args.save_state).write_text(json.dumps(iterator.get_state()))
        print("batches " + json.dumps(batches), flush=True)
    iterator.close()


if __name__ == "__main__":
    launch(run, __doc__)
