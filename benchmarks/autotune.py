"""Autotune against fixed settings: a loop's seconds with workers(1), a hand-picked workers(8)
and workers("auto"), on records that cost a GIL-free wait (storage reads).

`python benchmarks/autotune.py [--batches 200] [--record-ms 2] [--step-ms 5] [--rounds 3]`
prints, per setting, the median seconds of the loop (a training step of `--step-ms` per batch,
batches of 16 records of `--record-ms` each) over alternating rounds, and what autotune chose.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from loadax import Batcher, DataLoader, RangeDataset

BATCH = 16


def reader(record_ms: float) -> Any:
    def read(index: int) -> np.ndarray:
        time.sleep(record_ms / 1e3)
        return np.full(64, index, dtype=np.float32)

    return read


def loop_seconds(workers: Any, batches: int, record_ms: float, step_ms: float) -> tuple[float, Any]:
    dataset = RangeDataset(0, batches * BATCH).map(reader(record_ms))
    loader = DataLoader(Batcher()).batch_size(BATCH).workers(workers).build(dataset)
    started = time.perf_counter()
    for _ in loader:
        time.sleep(step_ms / 1e3)  # the training step
    return time.perf_counter() - started, loader.stats().tuning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--record-ms", type=float, default=2.0)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    settings: list[Any] = [1, 8, "auto"]
    seconds: dict[str, list[float]] = {str(setting): [] for setting in settings}
    chosen = None
    for _ in range(arguments.rounds):
        for setting in settings:
            took, tuning = loop_seconds(
                setting, arguments.batches, arguments.record_ms, arguments.step_ms
            )
            seconds[str(setting)].append(took)
            chosen = tuning if setting == "auto" else chosen
    floor = arguments.batches * arguments.step_ms / 1e3
    print(f"the loop's own steps: {floor:.2f} s")
    for setting, values in seconds.items():
        print(f"workers({setting!r}): median {statistics.median(values):.2f} s of {values}")
    print(f"autotune chose: {chosen}")


if __name__ == "__main__":
    main()
