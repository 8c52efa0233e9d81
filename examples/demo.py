"""The loadax demo: a worker on loopback serves a synthetic image pipeline to a RemoteDataLoader.

It runs the same pipeline locally and remotely, checks the batches are identical, reports
throughput of both, checkpoints and resumes the remote iterator, and stops the worker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from demo_pipeline import images
from local_processes import positive_int, start_worker, stop_worker

from loadax import DataLoader, Loader, RepeatedEpochWarning
from loadax.client import RemoteDataLoader

SHUFFLE_SEED = 0
CHECKPOINT_AFTER = 3


def digest(batch: Any) -> str:
    return hashlib.sha256(
        b"".join(np.ascontiguousarray(batch[k]).tobytes() for k in sorted(batch))
    ).hexdigest()


def progress(batches: Iterator[Any], total: int, label: str) -> Iterator[Any]:
    """The batches, with a progress bar on stderr when it is a terminal."""
    bar = sys.stderr.isatty()
    for done, batch in enumerate(batches, start=1):
        if bar:
            filled = 30 * done // total
            sys.stderr.write(f"\r{label:>8} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
        yield batch
    if bar:
        sys.stderr.write("\n")


def timed_run(loader: Loader[Any], label: str) -> tuple[list[str], dict[str, float], Any]:
    """Every batch's digest, the throughput, and the first batch."""
    start = time.perf_counter()
    digests: list[str] = []
    first: Any = None
    first_batch_s = 0.0
    records = megabytes = 0.0
    with iter(loader) as iterator:
        for batch in progress(iterator, len(loader), label):
            if first is None:
                first, first_batch_s = batch, time.perf_counter() - start
            digests.append(digest(batch))
            records += len(batch["label"])
            megabytes += sum(np.asarray(leaf).nbytes for leaf in batch.values()) / 1e6
    elapsed = time.perf_counter() - start
    return (
        digests,
        {
            "records": records,
            "batches": len(digests),
            "seconds": elapsed,
            "records_per_s": records / elapsed,
            "mb_per_s": megabytes / elapsed,
            "first_batch_ms": first_batch_s * 1e3,
        },
        first,
    )


def resume_check(loader: Loader[Any]) -> tuple[bool, str]:
    """Checkpoint after a few batches, restore a fresh iterator, and compare all that follows."""
    after = min(CHECKPOINT_AFTER, len(loader) - 1)
    # The check runs through the plan from step 0 again on purpose: not a second epoch.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RepeatedEpochWarning)
        with iter(loader) as original:
            for _ in range(after):
                next(original)
            checkpoint = json.dumps(original.get_state())  # what a training job would save
            expected = [digest(batch) for batch in original]
        with iter(loader) as resumed:
            resumed.set_state(json.loads(checkpoint))
            actual = [digest(batch) for batch in resumed]
    return expected == actual, f"state after {after} batches: {checkpoint}"


def describe(name: str, stats: dict[str, float]) -> str:
    return (
        f"{name}: {stats['records_per_s']:,.0f} records/s, {stats['mb_per_s']:,.1f} MB/s, "
        f"{stats['batches'] / stats['seconds']:,.1f} batches/s, first batch "
        f"{stats['first_batch_ms']:.1f} ms ({stats['records']:.0f} records in "
        f"{stats['batches']:.0f} batches)"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=positive_int, default=2048)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument("--workers", type=positive_int, default=2, help="loading threads")
    parser.add_argument("--transport", choices=["grpc", "zmq"], default="grpc")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pipeline = images(records=args.records)
    local = (
        DataLoader(pipeline.batcher)
        .batch_size(args.batch_size)
        .shuffle(seed=SHUFFLE_SEED)
        .num_epochs(args.epochs)
        .workers(args.workers)
        .prefetch(4)
        .build(pipeline.dataset)
    )
    with tempfile.TemporaryDirectory() as directory:
        worker, ready = start_worker(
            Path(directory),
            "images",
            "demo_pipeline:images",
            {"records": args.records},
            threads=args.workers,
        )
        try:
            address = ready["grpc"] if args.transport == "grpc" else ready["zmq"]
            target = f"{args.transport}://{address.removeprefix('tcp://')}"
            print(f"worker ready: serving {ready['pipelines']} at {target}")
            print(f"config: {json.dumps(vars(args))}")
            local_digests, local_stats, first = timed_run(local, "local")
            builder = (
                RemoteDataLoader([target], pipeline="images")
                .batch_size(args.batch_size)
                .shuffle(seed=SHUFFLE_SEED)
                .num_epochs(args.epochs)
                .prefetch(8)
            )
            with builder.build() as remote:
                remote_digests, remote_stats, _ = timed_run(remote, args.transport)
                identical, state_line = resume_check(remote)
        finally:
            status = stop_worker(worker)
    same = local_digests == remote_digests
    print(describe("local", local_stats))
    print(describe(f"remote {args.transport}", remote_stats))
    ratio = remote_stats["records_per_s"] / local_stats["records_per_s"]
    print(f"remote / local throughput: {ratio:.2f}")
    image, label = first["image"], first["label"]
    print(f"batch shapes: image={image.shape} {image.dtype}, label={label.shape} {label.dtype}")
    print(f"batches: {'identical' if same else 'MISMATCH'} in local and remote mode")
    print(state_line)
    print(f"resume check: {'identical' if identical else 'MISMATCH'}")
    print(f"worker stopped (exit status {status})")
    return 0 if same and identical and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
