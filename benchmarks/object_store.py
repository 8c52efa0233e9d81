"""`ParquetDataset` read from an S3-compatible server on loopback (moto in server mode) against the
same files on local disk, side by side: records/s and MB/s of the batches a loader yields.

Writes `--files` Parquet files (a 64-float32 vector and an int64 label per row, row groups of
`--row-group` rows) to a temporary directory and uploads them to a moto server started on a free
loopback port. Each round reads, in turn, every configuration with a new dataset (so no cache
carries over), through `DataLoader(...).workers(--workers)`: the whole epoch in order, and the
first `--shuffled-batches` batches of a shuffled epoch. Prints each round, then a Markdown table
of the medians. moto is a Python server: the store's numbers measure loadax, pyarrow and moto
together on this machine, not S3's own throughput.

    .venv/bin/python benchmarks/object_store.py --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from loadax import Batcher, DataLoader
from loadax.sources.parquet import ParquetDataset

BUCKET = "bench"
WIDTH = 64  # float32s per row's vector


@contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """A moto S3 server on a free loopback port until the block ends: its host:port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with log.open("w") as output, subprocess.Popen(command, stdout=output, stderr=output) as server:
        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
                    break
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start; see {log}")
                time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            server.terminate()
            server.wait(timeout=30)


def write_files(directory: Path, files: int, rows: int, row_group: int) -> list[Path]:
    """`files` Parquet files of `rows` rows each: {"x": WIDTH float32s, "label": int64}."""
    rng = np.random.default_rng(0)
    paths = []
    for number in range(files):
        vectors = rng.random((rows, WIDTH), dtype=np.float32)
        table = pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), WIDTH),
                "label": np.arange(number * rows, (number + 1) * rows, dtype=np.int64),
            }
        )
        paths.append(directory / f"part-{number:03}.parquet")
        pq.write_table(table, paths[-1], row_group_size=row_group)
    return paths


def throughput(
    make: Callable[[], ParquetDataset], batch: int, workers: int, shuffled: int | None
) -> tuple[float, float]:
    """(records/s, MB/s) of the batches of one epoch in order (`shuffled` None), or of the first
    `shuffled` batches of a shuffled one; the dataset is made (its footers read) untimed."""
    dataset = make()
    builder = DataLoader(Batcher()).batch_size(batch).workers(workers)
    if shuffled is not None:
        builder = builder.shuffle(seed=0)
    records = size = 0
    started = time.perf_counter()
    with iter(builder.build(dataset)) as batches:
        for number, loaded in enumerate(batches):
            if shuffled is not None and number == shuffled:
                break
            records += len(loaded["label"])
            size += sum(np.asarray(leaf).nbytes for leaf in loaded.values())
    seconds = time.perf_counter() - started
    dataset.close()
    return records / seconds, size / seconds / 1e6


def s3_filesystem(endpoint: str) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem on the moto server at `endpoint`."""
    return pafs.S3FileSystem(
        access_key="bench",
        secret_key="bench",
        endpoint_override=endpoint,
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rows", type=int, default=32768, help="rows per file")
    parser.add_argument("--row-group", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shuffled-batches", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, moto_server(Path(scratch) / "moto.log") as at:
        paths = write_files(Path(scratch), args.files, args.rows, args.row_group)
        store = s3_filesystem(at)
        store.create_dir(BUCKET)
        for path in paths:
            pafs.copy_files(str(path), f"{BUCKET}/{path.name}", destination_filesystem=store)
        megabytes = sum(path.stat().st_size for path in paths) / 1e6
        sources: dict[str, Callable[[], ParquetDataset]] = {
            "local disk": lambda: ParquetDataset(paths),
            "S3 (moto, loopback)": lambda: ParquetDataset(
                f"{BUCKET}/part-*.parquet", filesystem=store
            ),
        }
        orders: dict[str, int | None] = {
            "in order, whole epoch": None,
            f"shuffled, first {args.shuffled_batches} batches": args.shuffled_batches,
        }
        results: dict[tuple[str, str], list[tuple[float, float]]] = {
            (order, source): [] for order in orders for source in sources
        }
        for round_ in range(args.rounds):
            for order, shuffled in orders.items():
                for source, make in sources.items():
                    measured = throughput(make, args.batch, args.workers, shuffled)
                    results[order, source].append(measured)
                    print(
                        f"round {round_ + 1}: {source}, {order}: {measured[0]:,.0f} records/s, "
                        f"{measured[1]:,.2f} MB/s",
                        flush=True,
                    )
    rows = args.files * args.rows
    print(
        f"\n{os.cpu_count()} cores; {args.files} files, {rows:,} rows of {WIDTH} float32 + an "
        f"int64 ({megabytes:.1f} MB of Parquet), row groups of {args.row_group:,}; batches of "
        f"{args.batch}, {args.workers} worker threads; medians of {args.rounds} rounds\n"
    )
    print("| read | source | records/s | MB/s | vs local |\n|---|---|---|---|---|")
    for order in orders:
        local = statistics.median(rate for rate, _ in results[order, "local disk"])
        for source in sources:
            rate = statistics.median(rate for rate, _ in results[order, source])
            mb = statistics.median(mb for _, mb in results[order, source])
            print(f"| {order} | {source} | {rate:,.0f} | {mb:,.2f} | {rate / local:.2f}x |")


if __name__ == "__main__":
    main()
