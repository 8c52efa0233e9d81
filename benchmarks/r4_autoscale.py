"""R4 autoscale: real sleep-bound `loadax-worker` processes (R2's pipeline) on loopback, one
trainer whose demand steps 1 -> 6 -> 2 workers' worth, and a small controller standing in for
KEDA's rule (desired = ceil(sum of `workers_wanted`), here one trainer's) that starts and stops
real workers every `DECISION_S`; then the same run under Cachew's rule (one worker more or fewer
per decision, towards the same signal).

Reported per rule: the time from each demand step to >= 95 % of the demand delivered (over a
1 s window), worker-seconds (start-up included) over the oracle's (the right count from the
instant of each step: `workers_wanted`'s truth, one spare included; and the bare demand), and
the batches that differ from a local loader's (the records are R2's without the sleep). The
section goes into SIZING.md (and RESULTS.md's copy); the plot into r4.png.

    .venv/bin/python benchmarks/r4_autoscale.py
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_pipelines
import numpy as np
from fleet_sim import RESULTS, write_section
from r4_fleet import READY_S, Fleet

from loadax import DataLoader
from loadax.client import RemoteDataLoader

SIZING = Path(__file__).with_name("SIZING.md")
"""R4 and R1 with local members, measured apart (benchmarks/report.py puts it into RESULTS.md)."""
TITLE = "R4 autoscale"
COST_MS, BATCH, THREADS = 40, 8, 2
NOMINAL_RATE = THREADS * 1000 / (BATCH * COST_MS)
"""Batches per second of one worker by its sleeps alone (its threads split each batch's): 6.25.
The run measures the real one first (`calibrate`), overheads included: a worker's worth."""
PHASES: tuple[tuple[int, float], ...] = ((1, 25.0), (6, 60.0), (2, 60.0))
"""(workers' worth of demand, seconds): each step falls halfway between two decisions."""
DECISION_S = 10.0
"""Seconds between two decisions of the controller (KEDA polls every 15 s by default)."""
WINDOW_S = DECISION_S / 2
"""The loader's demand window (`sizing`): half the decision interval, so that the decision
after a step sees only the new demand."""
MAX_WORKERS = 10
STALL_TARGET = 0.02
CONFIG = f"""
[server]
grpc = "127.0.0.1:0"
threads = {THREADS}

[pipelines.r2]
factory = "bench_pipelines:r2"
args = {{ records = 1000000, cost_ms = {COST_MS} }}
"""


def keda(wanted: int, workers: int, before: int | None) -> int:
    """KEDA's rule on one trainer's signal: as many workers as wanted, with the scale-down
    stabilization of the HPA it drives (deploy/kubernetes/keda: fewer only once the previous
    decision wanted fewer too; there 120 s of 15 s polls, here one decision)."""
    del workers
    return wanted if before is None else max(wanted, before)


def cachew(wanted: int, workers: int, before: int | None) -> int:
    """Cachew's: one worker more or fewer per decision, towards what is wanted."""
    del before
    return workers + (wanted > workers) - (wanted < workers)


RULES = {"KEDA (ceil of the sum)": keda, "Cachew (one at a time)": cachew}
"""Each rule: (wanted now, workers now, wanted at the previous decision) -> workers."""


def truth(worth: int) -> int:
    """The workers that keep the stall under target with one to spare, at `worth` workers'
    worth of demand."""
    return math.ceil(worth * (1 - STALL_TARGET) - 1e-9) + 1


@dataclasses.dataclass
class Run:
    """What one rule's run recorded: each batch's time, each decision (time, wanted, workers)."""

    start: float = 0.0
    batches: list[float] = dataclasses.field(default_factory=list)
    decisions: list[tuple[float, int | None, int]] = dataclasses.field(default_factory=list)
    digests: list[str] = dataclasses.field(default_factory=list)
    worker_seconds: float = 0.0
    sizes: list[tuple[float, int]] = dataclasses.field(default_factory=list)


def digest(batch: Any) -> str:
    """A batch's bytes, hashed."""
    return hashlib.sha256(np.ascontiguousarray(batch).tobytes()).hexdigest()


def calibrate(folder: Path) -> float:
    """One worker's batches per second, kept busy by a loader (after its first 8 batches)."""
    config = folder / "worker.toml"
    config.write_text(CONFIG)
    fleet = Fleet(config)
    first = fleet.start()
    if not first.up.wait(READY_S) or first.error is not None or first.address is None:
        raise RuntimeError(f"the first worker did not start: {first.error}")
    loader = RemoteDataLoader([first.address], pipeline="r2").batch_size(BATCH).build()
    with loader, iter(loader) as batches:
        for _ in range(8):
            next(batches)
        started = time.monotonic()
        for _ in range(48):
            next(batches)
        rate = 48 / (time.monotonic() - started)
    fleet.close()
    return rate


def train(loader: Any, run: Run, done: threading.Event, rate: float) -> None:
    """The trainer: a step of 1 / demand seconds (a sleep) between batches, per phase, the
    demand being a number of workers' worth (`rate` each)."""
    with iter(loader) as batches:
        for worth, seconds in PHASES:
            step = 1 / (worth * rate)
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                time.sleep(step)
                run.digests.append(digest(next(batches)))
                run.batches.append(time.monotonic())
    done.set()


def one_run(rule_name: str, folder: Path, rate: float) -> Run:
    rule = RULES[rule_name]
    config = folder / "worker.toml"
    config.write_text(CONFIG)
    fleet = Fleet(config)
    first = fleet.start()
    if not first.up.wait(READY_S) or first.error is not None:
        raise RuntimeError(f"the first worker did not start: {first.error}")
    assert first.address is not None
    builder = (
        RemoteDataLoader([first.address], pipeline="r2")
        .batch_size(BATCH)
        .shuffle(seed=0)
        .sizing(STALL_TARGET, window=WINDOW_S)
    )
    run = Run()
    with builder.build() as loader:
        fleet.loader = loader
        done = threading.Event()
        run.start = time.monotonic()
        trainer = threading.Thread(target=train, args=(loader, run, done, rate), daemon=True)
        trainer.start()
        before = None
        while not done.wait(DECISION_S):
            wanted = loader.stats().workers_wanted
            workers = fleet.size
            if wanted is not None:
                fleet.resize(max(1, min(MAX_WORKERS, rule(wanted, workers, before))))
                before = wanted
            now = time.monotonic()
            run.decisions.append((now - run.start, wanted, fleet.size))
        end = time.monotonic()
        run.worker_seconds = fleet.worker_seconds(run.start, end)
        run.sizes = [(w.started - run.start, +1) for w in fleet.workers] + [
            ((w.stopped or end) - run.start, -1) for w in fleet.workers
        ]
    fleet.close()
    return run


def rate_at(times: list[float], start: float, at: float, window: float = 1.0) -> float:
    """Batches per second over the `window` seconds before `at` (run time)."""
    return sum(1 for t in times if at - window < t - start <= at) / window


def step_times(run: Run, rate: float) -> list[tuple[float, int] | None]:
    """Per demand step: seconds from it to the first 1 s window (wholly after it) with >= 95 %
    of the new demand delivered, and the decisions taken in between (None: never within the
    phase)."""
    found: list[tuple[float, int] | None] = []
    begin = 0.0
    for index, (worth, seconds) in enumerate(PHASES):
        if index:
            demand = worth * rate
            hit = None
            at = begin + 1.0
            while at <= begin + seconds:
                if rate_at(run.batches, run.start, at) >= 0.95 * demand:
                    decided = sum(1 for when, _, _ in run.decisions if begin < when < at)
                    hit = (at - begin, decided)
                    break
                at += 0.25
            found.append(hit)
        begin += seconds
    return found


def reference_digests(count: int) -> list[str]:
    """The local loader's first `count` batches of the same records (R2's, without the sleep)."""
    pipeline = bench_pipelines.r2(1000000, 0)
    loader = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=0).build(pipeline.dataset)
    digests = []
    with iter(loader) as batches:
        for _ in range(count):
            digests.append(digest(next(batches)))
    return digests


def plot(runs: dict[str, Run], path: Path, rate: float) -> None:
    # The benchmarks extra: only the plot needs it.
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    from matplotlib import pyplot  # type: ignore[import-not-found, unused-ignore]

    total = sum(seconds for _, seconds in PHASES)
    figure, axes = pyplot.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), sharex=True)
    for axis, (name, run) in zip(axes, runs.items(), strict=True):
        times = [0.25 * i for i in range(4, int(total * 4) + 1)]
        demand, begin = [], 0.0
        for worth, seconds in PHASES:
            demand += [(begin, worth * rate), (begin + seconds, worth * rate)]
            begin += seconds
        axis.plot(*zip(*demand, strict=True), "k--", label="demand (batches/s)")
        axis.plot(times, [rate_at(run.batches, run.start, t) for t in times], label="delivered")
        events, count, steps = sorted(run.sizes), 0, []
        for at, change in events:
            count += change
            steps.append((at, count))
        right = axis.twinx()
        right.step(*zip(*steps, strict=True), where="post", color="C2", label="workers")
        right.set(ylabel="workers", ylim=(0, MAX_WORKERS + 1))
        axis.set(title=name, ylabel="batches/s", ylim=(0, 6 * rate * 1.3))
        axis.legend(loc="upper left", fontsize=7)
        right.legend(loc="upper right", fontsize=7)
    axes[-1].set(xlabel="seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def report(runs: dict[str, Run], wall: float, rate: float, load: str) -> list[str]:
    oracle = sum(truth(worth) * seconds for worth, seconds in PHASES)
    bare = sum(worth * seconds for worth, seconds in PHASES)
    lines = [
        f"`python benchmarks/r4_autoscale.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f", {wall:.0f} s, 2 cores shared with other work: load average {load}): real "
        "`loadax-worker` processes on loopback, each a "
        f"sleep-bound R2 pipeline ({COST_MS} ms a record, batches of {BATCH}, {THREADS} "
        f"threads: {NOMINAL_RATE:g} batches/s a worker by its sleeps, {rate:.1f} measured "
        "first, overheads included: a worker's worth); one trainer whose demand steps "
        + " -> ".join(f"{worth} ({seconds:g} s)" for worth, seconds in PHASES)
        + f" workers' worth; a decision every {DECISION_S:g} s from `stats().workers_wanted` "
        f"(measured over the last {WINDOW_S:g} s, stall target {STALL_TARGET:.0%}, one "
        "spare), starting or stopping real workers (`add_target` once up, `remove_target` "
        "then SIGTERM). KEDA's rule keeps its HPA's scale-down stabilization (fewer workers only "
        "once the previous decision wanted fewer too); Cachew's moves one worker a decision. "
        "A step is met when a 1 s window after it delivers >= 95 % of the new "
        f"demand. The oracle runs {', '.join(str(truth(w)) for w, _ in PHASES)} workers (the "
        f"truth of `workers_wanted`, one spare included) from the instant of each step: "
        f"{oracle:g} worker-seconds; the bare demand is {bare:g}.",
        "",
        "| rule | step 1 -> 6: time to 95 % (decisions in it) | 6 -> 2 | worker-seconds "
        "| ÷ oracle | ÷ bare demand | decisions (s: wanted -> workers) "
        "| batches differing from local |",
        "|---|---|---|---|---|---|---|---|",
    ]
    longest = max(len(run.digests) for run in runs.values())
    reference = reference_digests(longest)
    for name, run in runs.items():
        up, down = step_times(run, rate)
        decided = ", ".join(f"{at:.0f}: {wanted} -> {size}" for at, wanted, size in run.decisions)
        differing = sum(a != b for a, b in zip(run.digests, reference, strict=False))
        lines.append(
            f"| {name} | {_seconds(up)} | {_seconds(down)} | {run.worker_seconds:.0f} | "
            f"{run.worker_seconds / oracle:.2f} | {run.worker_seconds / bare:.2f} | {decided} | "
            f"{differing} of {len(run.digests)} |"
        )
    lines += [
        "",
        f"Targets: >= 95 % of demand within 2 decisions ({2 * DECISION_S:g} s) of a step; "
        "worker-seconds <= 1.15x the oracle; 0 batches differing.",
        "",
        "![R4: demand, delivered and workers over time under each rule](r4.png)",
    ]
    return lines


def _seconds(value: tuple[float, int] | None) -> str:
    if value is None:
        return "not within the phase"
    seconds, decisions = value
    return f"{seconds:.1f} s ({decisions} decision{'s' * (decisions != 1)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=SIZING)
    parser.add_argument(
        "--try", dest="trial", action="store_true", help="phases a third as long; no report"
    )
    args = parser.parse_args(argv)
    if args.trial:
        global PHASES
        PHASES = tuple((worth, seconds / 3) for worth, seconds in PHASES)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="loadax-r4-") as folder:
        rate = calibrate(Path(folder))
        print(f"a worker's worth: {rate:.2f} batches/s", flush=True)
        for name in RULES:
            runs[name] = one_run(name, Path(folder), rate)
            print(name, step_times(runs[name], rate), runs[name].decisions, flush=True)
    load = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    lines = report(runs, time.monotonic() - started, rate, load)
    print("\n".join(lines))
    if args.trial:
        return 0
    plot(runs, Path(__file__).with_name("r4.png"), rate)
    for path in (args.out, RESULTS):
        write_section(path, TITLE, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
