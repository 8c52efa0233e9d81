"""Epoch after epoch with loader processes: each epoch's seconds, threads and processes alike.

`python benchmarks/epoch_processes.py [--epochs 3] [--records 10000] [--table-mb 64]` prints one
line per kind: the seconds of each `loader.epoch(e)` loop and of its first batch. The records
are read from an in-memory table of `--table-mb` (a vocabulary, an index), which every loader
process unpickles when it starts. Processes that lived only as long as one iterator
made every epoch pay their start-up (issue 30); shared by the loader's iterators, the epochs
after the first cost what the first costs, or less.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from loadax import Batcher, DataLoader, InMemoryDataset, RangeDataset, ZippedDataset


def python_work(index: int) -> np.ndarray:
    """A record made in Python, holding the GIL (a tokenizer, a parser) for about 0.1 ms."""
    total = 0
    for value in range(400):
        total += (value * index) % 7
    return np.full(16, total, dtype=np.int64)


def epoch_seconds(kind: str, epochs: int, records: int, table_mb: int) -> list[tuple[float, float]]:
    """(seconds of the epoch, seconds to its first batch) of each epoch."""
    builder = DataLoader(Batcher()).batch_size(32).workers(2, kind=kind)  # type: ignore[arg-type]
    table = InMemoryDataset(np.zeros((records, (table_mb << 20) // (8 * records))))
    dataset = ZippedDataset([RangeDataset(0, records).map(python_work), table]).map(first)
    seconds = []
    with builder.build(dataset) as loader:
        for epoch in range(epochs):
            started = time.perf_counter()
            iterator = loader.epoch(epoch)
            next(iterator)
            first_batch = time.perf_counter() - started
            for _ in iterator:
                pass
            seconds.append((time.perf_counter() - started, first_batch))
    return seconds


def first(pair: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    return pair[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--table-mb", type=int, default=64)
    arguments = parser.parse_args()
    for kind in ("threads", "processes"):
        seconds = epoch_seconds(kind, arguments.epochs, arguments.records, arguments.table_mb)
        shown = ", ".join(f"{epoch:.3f} (first batch {batch:.3f})" for epoch, batch in seconds)
        total = sum(epoch for epoch, _ in seconds)
        print(f"{kind:9s} epochs (s): {shown}; total {total:.3f}")


if __name__ == "__main__":
    main()
