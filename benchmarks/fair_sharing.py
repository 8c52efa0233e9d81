"""Fair sharing between jobs: `--jobs` trainer processes read from `--workers` workers (one
loading thread each), the first job with `in_flight_per_worker(16)`, the others the default (2).
Every job is backlogged (it asks for batches as fast as they come) for `--seconds`; prints each
job's batches per second and the ratio of the greedy job's rate to the mean of the others'.

    .venv/bin/python benchmarks/fair_sharing.py --transport grpc --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from local_worker import worker

from loadax.client import RemoteDataLoader

CONFIG = """
[server]
zmq = "tcp://127.0.0.1:0"
grpc = "127.0.0.1:0"
threads = 1
max_in_flight_per_client = 16

[pipelines.r2]
factory = "bench_pipelines:r2"
args = {{ records = 1000000, cost_ms = {cost_ms} }}
"""
GREEDY = 16
BATCH = 4


def job(targets: list[str], in_flight: int | None) -> None:
    """One job: reads batches without pause, prints "ready" once it has some, and on "start"
    and "stop" (stdin) counts the batches in between; prints them and the seconds as JSON."""
    builder = RemoteDataLoader(targets, pipeline="r2").batch_size(BATCH)
    if in_flight is not None:
        builder = builder.in_flight_per_worker(in_flight)
    marks: list[tuple[int, float]] = []
    done = threading.Event()
    count = 0

    def listen() -> None:
        for _ in ("start", "stop"):
            sys.stdin.readline()
            marks.append((count, time.perf_counter()))
        done.set()

    with builder.build() as loader, iter(loader) as iterator:
        for _ in range(3):
            next(iterator)
        threading.Thread(target=listen, daemon=True).start()
        print("ready", flush=True)
        while not done.is_set():
            next(iterator)
            count += 1
    (first, started), (last, stopped) = marks
    print(json.dumps({"batches": last - first, "seconds": stopped - started}), flush=True)


def measure(targets: list[str], jobs: int, seconds: float) -> list[float]:
    """Each job's batches per second, the greedy one first, measured over the same `seconds`."""
    command = [sys.executable, __file__, "--job", ",".join(targets)]
    with contextlib.ExitStack() as stack:
        processes = [
            stack.enter_context(
                subprocess.Popen(
                    [*command, *(["--in-flight", str(GREEDY)] if index == 0 else [])],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for index in range(jobs)
        ]
        for process in processes:
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError("a job failed to start")
        time.sleep(1.0)  # every job backlogged
        for word in ("start", "stop"):
            for process in processes:
                assert process.stdin is not None
                process.stdin.write(word + "\n")
                process.stdin.flush()
            if word == "start":
                time.sleep(seconds)
        rates = []
        for process in processes:
            assert process.stdout is not None
            result = json.loads(process.stdout.readline())
            rates.append(result["batches"] / result["seconds"])
            process.wait(timeout=60)
        return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["grpc", "zmq"], default="grpc")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cost-ms", type=int, default=5, help="per record; 4 records a batch")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--in-flight", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job.split(","), args.in_flight)
        return
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
        targets = []
        for index in range(args.workers):
            config = Path(directory) / f"worker{index}.toml"
            config.write_text(CONFIG.format(cost_ms=args.cost_ms))
            targets.append(stack.enter_context(worker(config, args.transport)).address)
        rates = measure(targets, args.jobs, args.seconds)
    others = statistics.mean(rates[1:])
    print(
        f"{args.transport}: {args.jobs} jobs on {args.workers} workers (1 thread each), "
        f"{args.seconds:g} s; batches/s: greedy (in_flight_per_worker({GREEDY})) "
        f"{rates[0]:.1f}, others {', '.join(f'{rate:.1f}' for rate in rates[1:])}; "
        f"ratio {rates[0] / others:.2f}"
    )


if __name__ == "__main__":
    main()
