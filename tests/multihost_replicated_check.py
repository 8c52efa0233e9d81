"""One process of a real multi-process JAX job whose processes own the same rows (its data axis
is held by one device of every process), started by tests/test_replicated_rows.py.

Each process loads every step from the `loadax-worker`s named by --targets, and checks each
gathered global batch against the local loader's, byte for byte. It prints how the workers
answered its requests (computed, coalesced, cached) and where its loader sits on the ring of
workers.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pipelines
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from multihost_check import launch

from loadax import Batcher, DataLoader
from loadax.builder import LoaderBuilder
from loadax.client import RemoteDataLoader
from loadax.client.job import job_seat, row_groups
from loadax.delivery.meshes import devices_by_process

RECORDS, SIDE = 40, 8  # the worker config's args of pipeline "images"
BATCH = 8
EPOCHS = 2


def planned(builder: LoaderBuilder) -> LoaderBuilder:
    return builder.batch_size(BATCH).shuffle(seed=3).num_epochs(EPOCHS)


def run(args: argparse.Namespace) -> None:
    local = planned(DataLoader(Batcher())).build(pipelines.images(RECORDS, SIDE).dataset)
    reference = list(local)
    # (process, local device) transposed: data row i is held by device i of every process.
    mesh = Mesh(devices_by_process().T, ("data", "model"))
    remote = RemoteDataLoader(args.targets.split(","), pipeline="images")
    # A hedge asks a second worker on purpose: none here, so that each computation counts.
    remote = planned(remote).hedge_after(None).prefetch(1)  # affinity: on by default here
    loader = remote.shard(mesh, "data").build()
    strategy = loader.sharding_strategy
    with loader, iter(loader) as iterator:
        steps = 0
        for step, rows in enumerate(iterator):
            assert len(rows["label"]) == BATCH, "each process owns every row"
            gathered = multihost_utils.process_allgather(
                strategy.distribute_global_batch(rows), tiled=True
            )
            for name, expected in reference[step].items():
                got = np.asarray(gathered[name])
                assert got.dtype == expected.dtype, (step, name)
                assert got.tobytes() == expected.tobytes(), (step, name)
            steps += 1
        assert steps == len(reference), steps
        reuse = loader.stats().reuse
    told = {"computed": reuse.misses, "coalesced": reuse.coalesced, "cached": reuse.hits}
    print("replies " + json.dumps(told), flush=True)
    print(f"seat {job_seat('images', row_groups(mesh, 'data')).position!r}", flush=True)


def targets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", required=True, help="the workers' addresses, by commas")


if __name__ == "__main__":
    launch(run, __doc__, targets)
