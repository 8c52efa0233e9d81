"""One `loadax-worker` with a GIL-bound (pure-Python) transform: its batches loaded on threads,
or in 1 or 2 child processes (`--processes`), read by a `RemoteDataLoader` over ZeroMQ (or gRPC).

Each round starts each configuration's worker afresh (in turn, so that drift hits all alike),
loads `--warmup` batches (the children start on the first request), then times `--batches`.
Prints records/s per round, the medians, and each median's ratio to threads.

    .venv/bin/python benchmarks/worker_processes.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from local_worker import worker

from loadax.client import RemoteDataLoader

CONFIG = """
[server]
zmq = "tcp://127.0.0.1:0"
grpc = "127.0.0.1:0"
threads = {threads}

[pipelines.gil]
factory = "bench_pipelines:gil_bound"
args = {{ records = 100000, loops = {loops} }}
"""
SETTINGS = {"threads (2)": 0, "1 process": 1, "2 processes": 2}


def config(directory: Path, loops: int) -> Path:
    """The worker's config file, written in `directory`."""
    path = directory / "worker.toml"
    path.write_text(CONFIG.format(threads=2, loops=loops))
    return path


def rate(address: str, batch: int, warmup: int, batches: int) -> float:
    """Records per second over `batches` batches, after `warmup` more."""
    loader = RemoteDataLoader([address], pipeline="gil").batch_size(batch).build()
    with loader, iter(loader) as iterator:
        for _ in range(warmup):
            next(iterator)
        started = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        return batch * batches / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transport", choices=["zmq", "grpc"], default="zmq")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--loops", type=int, default=20000, help="Python steps per record")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as directory:
        for round_ in range(args.rounds):
            for name, processes in SETTINGS.items():
                settings = config(Path(directory), args.loops)
                with worker(settings, args.transport, "--processes", str(processes)) as served:
                    rates[name].append(rate(served.address, args.batch, args.warmup, args.batches))
                print(f"round {round_ + 1}: {name}: {rates[name][-1]:,.0f} records/s", flush=True)
    base = statistics.median(rates["threads (2)"])
    print(
        f"\n{os.cpu_count()} cores; {args.loops} Python steps per record, batches of {args.batch}"
    )
    print("| loading | records/s (median) | vs threads |\n|---|---|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
