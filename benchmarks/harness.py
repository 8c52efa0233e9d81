"""What every runner script shares: its command line, the timed loop and the record it writes.

A runner is one script per system family (loadax, torch, tf.data, ...), run by path in its own
process and environment by `run.py`. It maps system names to `System`s; `main` sets one up
(untimed), times it from creating the iterator to the last batch, and writes one JSON record.
Needs nothing but numpy, like `workloads`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from workloads import SCALES, Workload, workload


@dataclasses.dataclass(frozen=True, slots=True)
class Setup:
    """What a system is asked to run: the workload, and `options` from the driver (addresses)."""

    workload: Workload
    options: Mapping[str, str]

    def option(self, key: str) -> str:
        if key not in self.options:
            raise ValueError(f"this system needs --option {key}=...; got {dict(self.options)}")
        return self.options[key]


@dataclasses.dataclass(frozen=True, slots=True)
class Trial:
    """A system set up and ready: `batches()` creates the iterator (the clock starts before it).

    `prefetch`, for a remote client, is the batches it holds ahead, ready and in flight: its peak
    RSS is then checked against base + (prefetch + 2) x batch bytes.
    """

    batches: Callable[[], Iterable[Any]]
    close: Callable[[], None] = lambda: None
    prefetch: int | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


System = Callable[[Setup], Trial]
MAX_RSS_BYTES = 8 << 30
MEMORY_POLL_S = 0.05


def peak_rss_bytes(usage: resource.struct_rusage) -> int:
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return usage.ru_maxrss * scale


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def guard_memory(limit: int) -> None:
    """Stop this run (exit status 3) once its RSS passes `limit` bytes: a system that leaks must
    not take a shared machine down with it. Linux only (reads /proc/self/statm)."""
    statm = Path("/proc/self/statm")
    if not statm.is_file():
        return
    page = os.sysconf("SC_PAGE_SIZE")

    def watch() -> None:
        while True:
            rss = int(statm.read_text().split()[1]) * page
            if rss > limit:
                print(
                    f"stopped: RSS reached {rss >> 20} MiB, past the suite's limit of "
                    f"{limit >> 20} MiB per run",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(3)
            time.sleep(MEMORY_POLL_S)

    threading.Thread(target=watch, name="rss-guard", daemon=True).start()


def rss_limit() -> int:
    """A third of the machine's memory, at most `MAX_RSS_BYTES`."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(MAX_RSS_BYTES, physical // 3)


def leaves(batch: Any) -> list[np.ndarray[Any, Any]]:
    """The arrays of a batch (a pytree of dicts, lists and tuples), in order."""
    if isinstance(batch, dict):
        return [leaf for value in batch.values() for leaf in leaves(value)]
    if isinstance(batch, list | tuple):
        return [leaf for value in batch for leaf in leaves(value)]
    return [np.asarray(batch)]


def measure(trial: Trial, max_seconds: float) -> dict[str, Any]:
    """Time `trial` from creating its iterator to its last batch (or past `max_seconds`), with
    this (the receiving) process's CPU time and minor page faults over that time, and the time,
    CPU and bytes up to the first batch (start-up: the rest is the steady state)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    elements = size = batches = largest = 0
    first_batch_s: float | None = None
    first_batch_cpu_s, first_batch_bytes = 0.0, 0
    capped = False
    start = time.perf_counter()
    for batch in trial.batches():
        now = time.perf_counter() - start
        if first_batch_s is None:
            first_batch_s = now
            first_batch_cpu_s = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF))
        arrays = leaves(batch)
        elements += arrays[0].shape[0] if arrays[0].ndim else 1
        batch_bytes = sum(array.nbytes for array in arrays)
        first_batch_bytes = first_batch_bytes or batch_bytes
        size += batch_bytes
        largest = max(largest, batch_bytes)
        batches += 1
        if now > max_seconds:
            capped = True
            break
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    if not batches:
        raise RuntimeError("the system yielded no batch")
    base, peak = peak_rss_bytes(before), peak_rss_bytes(after)
    return {
        "elements": elements,
        "bytes": size,
        "batches": batches,
        "seconds": seconds,
        "elements_per_s": elements / seconds,
        "bytes_per_s": size / seconds,
        "first_batch_s": first_batch_s,
        "cpu_s": cpu_seconds(after) - cpu_seconds(before),
        "first_batch_cpu_s": first_batch_cpu_s - cpu_seconds(before),
        "first_batch_bytes": first_batch_bytes,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "capped": capped,
        "peak_rss_bytes": peak,
        "base_rss_bytes": base,
        "batch_bytes": largest,
        "memory_bound_bytes": (
            None if trial.prefetch is None else base + (trial.prefetch + 2) * largest
        ),
    }


def parse_args(argv: list[str] | None, systems: Iterable[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run one system on one workload; write a record.")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--system", required=True, choices=sorted(systems))
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("--data", type=Path, required=True, help="the directory of data files")
    parser.add_argument("--record", type=Path, required=True, help="where to write the JSON")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="e.g. targets=..."
    )
    return parser.parse_args(argv)


def options(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"--option must be KEY=VALUE, got {pair!r}")
        result[key] = value
    return result


def write_record(path: Path, args: argparse.Namespace, numbers: Mapping[str, Any]) -> None:
    record = {"workload": args.workload, "system": args.system, "scale": args.scale, **numbers}
    path.write_text(json.dumps(record) + "\n")


def main(systems: Mapping[str, System], argv: list[str] | None = None) -> None:
    """Run the system the command line names and write its record, then exit at once.

    Exiting without waiting matters: some peers leave non-daemon threads that spin on forever.
    """
    args = parse_args(argv, systems)
    guard_memory(rss_limit())
    status = 0
    try:
        setup = Setup(workload(args.workload, args.scale, args.data), options(args.option))
        trial = systems[args.system](setup)
        try:
            numbers = measure(trial, setup.workload.max_seconds)
        finally:
            trial.close()
        write_record(args.record, args, {**numbers, "extra": dict(trial.extra)})
    except Exception:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
