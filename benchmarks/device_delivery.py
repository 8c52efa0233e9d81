"""Delivery onto an accelerator, where there is one: the demo's image pipeline as global
jax.Arrays on the devices, from a local loader and from a RemoteDataLoader fed by a worker on
loopback (ZeroMQ and gRPC), each checked byte-identical to the host batches of the local loader.

For each mode a loop takes every batch and runs a step on the devices that reads all of it;
reported: the rate batches reach the devices (GB/s), the share of the loop spent waiting for
them (input stall), and beside them `jax.device_put` of a batch already in host memory (the
copy's own cost, the floor). The remote modes (the same-host shared-memory path, and sockets
with it off) run after a warm-up, alternated `--rounds` times; each mode's median round counts.

    python benchmarks/device_delivery.py [--batches 64] [--batch-size 256] [--rounds 3] --json PATH
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from demo_pipeline import images  # noqa: E402
from local_processes import start_worker, stop_worker  # noqa: E402

from loadax import DataLoader  # noqa: E402
from loadax.client import RemoteDataLoader  # noqa: E402

SEED = 0


def digest(batch: Any) -> str:
    """The bytes of a batch's leaves, host or device arrays, in the dtypes JAX gives them
    (int64 is int32 on devices unless x64 is enabled)."""
    leaves = (np.asarray(batch[key]) for key in sorted(batch))
    return hashlib.sha256(
        b"".join(
            np.ascontiguousarray(leaf, dtype=jax.dtypes.canonicalize_dtype(leaf.dtype)).tobytes()
            for leaf in leaves
        )
    ).hexdigest()


@jax.jit
def step(batch: Any) -> jax.Array:
    """A step that reads every byte of the batch on its devices."""
    return sum(
        (jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(batch)), jnp.zeros(())
    )


def run(loader: Any, batches: int) -> dict[str, Any]:
    """Take `batches` batches, a step on each; the rate and the stall, and their digests."""
    digests, waited, nbytes = [], 0.0, 0
    start = time.perf_counter()
    with iter(loader) as iterator:
        for _ in range(batches):
            asked = time.perf_counter()
            batch = next(iterator)
            waited += time.perf_counter() - asked
            step(batch).block_until_ready()
            nbytes += sum(leaf.nbytes for leaf in jax.tree.leaves(batch))
            digests.append(digest(batch))
    seconds = time.perf_counter() - start
    return {
        "gb_per_s": nbytes / seconds / 1e9,
        "stall_fraction": waited / seconds,
        "seconds": seconds,
        "on_devices": all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(batch)),
        "digests": digests,
    }


def copy_floor(batch: Any, mesh: jax.sharding.Mesh, repeats: int = 20) -> float:
    """GB/s of `jax.device_put` of one host batch, sharded over `mesh` as the loaders do."""
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))  # type: ignore[no-untyped-call]
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(batch))
    for leaf in jax.tree.leaves(jax.device_put(batch, sharding)):
        leaf.block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        for leaf in jax.tree.leaves(jax.device_put(batch, sharding)):
            leaf.block_until_ready()
    return float(nbytes * repeats / (time.perf_counter() - start) / 1e9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=4, help="loading threads, each mode")
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs of each remote mode")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    records = args.batches * args.batch_size
    pipeline = images(records=records)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))

    def configure(builder: Any) -> Any:
        return builder.batch_size(args.batch_size).shuffle(seed=SEED).prefetch(8)

    host = configure(DataLoader(pipeline.batcher)).workers(args.threads).build(pipeline.dataset)
    reference = run(host, args.batches)
    first = next(iter(host))
    report: dict[str, Any] = {
        "devices": [str(device) for device in jax.devices()],
        "batch_mb": sum(leaf.nbytes for leaf in jax.tree.leaves(first)) / 1e6,
        "device_put_gb_per_s": copy_floor(first, mesh),
        "modes": {},
    }
    local = (
        configure(DataLoader(pipeline.batcher))
        .workers(args.threads)
        .shard(mesh, "data")
        .device_prefetch(2)
        .build(pipeline.dataset)
    )
    report["modes"]["local"] = run(local, args.batches)
    with tempfile.TemporaryDirectory() as directory:
        worker, ready = start_worker(
            Path(directory),
            "images",
            "demo_pipeline:images",
            {"records": records},
            threads=args.threads,
        )
        try:
            rounds: dict[str, list[dict[str, Any]]] = {}
            for number in range(args.rounds + 1):  # round 0 warms the worker up
                for transport in ("zmq", "grpc"):
                    for shared in (True, False):
                        target = f"{transport}://{ready[transport].removeprefix('tcp://')}"
                        builder = configure(RemoteDataLoader([target], pipeline="images"))
                        builder = builder.shared_memory(shared).shard(mesh, "data")
                        with builder.device_prefetch(2).build() as remote:
                            result = run(remote, args.batches)
                        if number:
                            name = transport + ("" if shared else " sockets")
                            rounds.setdefault(name, []).append(result)
        finally:
            stop_worker(worker)
    for name, results in rounds.items():
        median = statistics.median(result["gb_per_s"] for result in results)
        report["modes"][name] = min(results, key=lambda result: abs(result["gb_per_s"] - median))
    failed = False
    for name, mode in report["modes"].items():
        mode["identical"] = mode.pop("digests") == reference["digests"]
        failed |= not (mode["identical"] and mode["on_devices"])
        print(
            f"{name}: {mode['gb_per_s']:.2f} GB/s to the devices, stall "
            f"{mode['stall_fraction']:.1%}, identical to the host batches: {mode['identical']}"
        )
    print(f"device_put of a batch in host memory: {report['device_put_gb_per_s']:.2f} GB/s")
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
