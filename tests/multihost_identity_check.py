"""One process of a real multi-process JAX job whose remote loaders must agree on one pipeline
identity, started by tests/test_job_identity.py.

Each process serves its own in-process worker: with --mixed, process p's worker runs other code
(its map multiplies by p + 1). Sharded over the job's mesh, the loaders of a mixed job must all
raise at build, naming each process's fingerprint; the others load and print a digest of the
rows of the global batches it loads, and where its loader sits on the ring of workers.
"""

from __future__ import annotations

import argparse
import hashlib

import jax
import numpy as np
from jax.sharding import Mesh

from loadax import Batcher, Pipeline, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.client.job import job_seat, row_groups
from loadax.server.worker import Worker


def pipeline(factor: int) -> Pipeline:
    return Pipeline(RangeDataset(0, 32).map(lambda x: np.int64(x * factor)), Batcher())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--mixed", action="store_true")
    args = parser.parse_args()
    jax.distributed.initialize(
        args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
    )
    factor = args.process_id + 1 if args.mixed else 1
    worker = Worker({"numbers": pipeline(factor)}, threads=1)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    builder = RemoteDataLoader([worker], pipeline="numbers").batch_size(8).shard(mesh, "data")
    try:
        loader = builder.startup(timeout=30).build()
    except ValueError as error:
        print(f"raised: {error}")
        worker.close()
        return
    digest = hashlib.sha256()
    with loader:
        for batch in loader:
            digest.update(np.asarray(batch).tobytes())  # this process's rows
    print(f"fingerprint {loader.identity.fingerprint}")
    print(f"digest {digest.hexdigest()}")
    print(f"seat {job_seat('numbers', row_groups(mesh, 'data')).position!r}")
    worker.close()


if __name__ == "__main__":
    main()
