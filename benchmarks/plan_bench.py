"""Workload P1 of BENCHMARKS.md: indices/s and peak memory of a shuffled `Plan` over 10**10 records.

Usage: `python benchmarks/plan_bench.py [--repeats N] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from loadax import Plan

DEFAULT_RECORDS = 10**10
DEFAULT_LARGE_BATCH = 1 << 20
DEFAULT_SMALL_BATCH = 4096
MEMORY_RECORDS = (10**7, 10**10, 10**12)
# Epochs the timed steps are drawn from: the first two and a far one, so that a per-epoch cost
# (deriving the epoch's key) is paid as it would be in training.
EPOCHS = (0, 1, 1000)
SEED = 1234


@dataclasses.dataclass(frozen=True, slots=True)
class SpeedResult:
    """Throughput of `Plan.indices` over `steps` for one batch size."""

    batch_size: int
    steps: int
    indices_per_run: int
    runs_indices_per_s: list[float]

    @property
    def median_indices_per_s(self) -> float:
        return statistics.median(self.runs_indices_per_s)


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryResult:
    """Peak numpy/Python allocation (tracemalloc) while computing the indices of one step."""

    num_records: int
    batch_size: int
    indices: int
    peak_bytes: int

    @property
    def bytes_per_index(self) -> float:
        return self.peak_bytes / self.indices


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    num_records: int
    repeats: int
    speed: list[SpeedResult]
    memory: list[MemoryResult]
    rss_increase_bytes: int


def shuffled_plan(num_records: int, batch_size: int) -> Plan:
    return Plan(num_records, batch_size, seed=SEED, shuffle=True, num_epochs=None)


def sample_steps(plan: Plan, per_epoch: int) -> list[int]:
    """`per_epoch` steps spread evenly over each epoch of `EPOCHS` (short last batches included)."""
    per_epoch = min(per_epoch, plan.steps_per_epoch)
    return [
        epoch * plan.steps_per_epoch + (k * (plan.steps_per_epoch - 1)) // max(1, per_epoch - 1)
        for epoch in EPOCHS
        for k in range(per_epoch)
    ]


def measure_speed(num_records: int, batch_size: int, per_epoch: int, repeats: int) -> SpeedResult:
    plan = shuffled_plan(num_records, batch_size)
    steps = sample_steps(plan, per_epoch)
    total = sum(plan.batch_length(step) for step in steps)
    plan.indices(steps[0])  # warm-up: first-call costs are not throughput
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for step in steps:
            plan.indices(step)
        runs.append(total / (time.perf_counter() - start))
    return SpeedResult(batch_size, len(steps), total, runs)


def measure_memory(num_records: int, batch_size: int) -> MemoryResult:
    plan = shuffled_plan(num_records, batch_size)
    step = plan.steps_per_epoch + 1  # a full batch in the second epoch
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        plan.indices(step)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return MemoryResult(num_records, batch_size, plan.batch_length(step), peak - before)


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def run(args: argparse.Namespace) -> Report:
    rss_before = peak_rss_bytes()
    batches = (args.batch_size, args.small_batch_size)
    memory = [
        measure_memory(records, batch)
        for batch in batches
        for records in sorted({*MEMORY_RECORDS, args.records})
    ]
    speed = [
        measure_speed(args.records, args.batch_size, 3, args.repeats),
        measure_speed(args.records, args.small_batch_size, 100, args.repeats),
    ]
    return Report(args.records, args.repeats, speed, memory, peak_rss_bytes() - rss_before)


def report(result: Report) -> None:
    lines = [
        f"P1 planner: shuffled Plan over {result.num_records:,} records, "
        f"median of {result.repeats} runs",
        "",
        f"{'batch size':>12} {'steps':>6} {'indices/run':>12} {'median M indices/s':>19}"
        f" {'min':>7} {'max':>7}",
    ]
    for speed in result.speed:
        lines.append(
            f"{speed.batch_size:>12,} {speed.steps:>6} {speed.indices_per_run:>12,}"
            f" {speed.median_indices_per_s / 1e6:>19.2f}"
            f" {min(speed.runs_indices_per_s) / 1e6:>7.2f}"
            f" {max(speed.runs_indices_per_s) / 1e6:>7.2f}"
        )
    lines += [
        "",
        "peak memory of one plan.indices(step) call (tracemalloc):",
        f"{'records':>18} {'batch size':>12} {'peak MiB':>9} {'bytes/index':>12}",
    ]
    for memory in result.memory:
        lines.append(
            f"{memory.num_records:>18,} {memory.batch_size:>12,}"
            f" {memory.peak_bytes / 2**20:>9.2f} {memory.bytes_per_index:>12.1f}"
        )
    lines += [
        "",
        f"process peak RSS increase over the whole benchmark: "
        f"{result.rss_increase_bytes / 2**20:.1f} MiB",
    ]
    print("\n".join(lines))


def to_json(result: Report) -> dict[str, Any]:
    return {
        "workload": "P1",
        "num_records": result.num_records,
        "repeats": result.repeats,
        "speed": [
            {
                **dataclasses.asdict(speed),
                "median_indices_per_s": speed.median_indices_per_s,
            }
            for speed in result.speed
        ],
        "memory": [
            {**dataclasses.asdict(memory), "bytes_per_index": memory.bytes_per_index}
            for memory in result.memory
        ],
        "rss_increase_bytes": result.rss_increase_bytes,
    }


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=positive_int, default=DEFAULT_RECORDS)
    parser.add_argument("--batch-size", type=positive_int, default=DEFAULT_LARGE_BATCH)
    parser.add_argument("--small-batch-size", type=positive_int, default=DEFAULT_SMALL_BATCH)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    report(result)
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
