"""Issue 26's targets from one run: what a remote batch costs the worker and the trainer per GB,
against the local loader and the raw sockets.

Each round runs, each in a process of its own and in turn, `profile_remote.py` on R1 (W2's
images, 2 epochs; `--rounds`) and W3 (its CPU-heavy FFTs, 1 epoch; `--w3-rounds`): the local
loader, ZeroMQ and gRPC, each through the same-host fast path (the worker on loopback writes into
the trainer's memory) and over the sockets (as from another host). Then `run.py --workloads T1
--scale quick` gives the transports' yardsticks in the same run: raw TCP into a reused buffer,
plain grpcio, and loadax's rates and client CPU on pre-built 8 MiB batches. Last, `perf` records
one worker and one client on R1 (fast path, ZeroMQ) for the reply checksum's share of their
samples.

The verdicts (CPU seconds per GB, user + system): a round runs the local loader and the four
paths of a pipeline next to each other (in an order that turns by one each round), so each
path's ratio to the local loader is taken within its round, and a verdict is on the median of
those paired ratios, not on the ratio of medians: on these shared cores a run's CPU per GB moves
+-20 % with the load, and neighbours move together. From 6 rounds on, the measured column gives
the median's 95 % interval (`paired.py`) and a verdict whose interval holds its limit says it is
not told apart from it. W3's worker target is 2 % above its local loader's CPU (1.5 raw sends
of about 0.3 s/GB on 20 s/GB), so W3 runs more rounds (`--w3-rounds`; about a minute each).
- worker <= the local loader's + 1.5 x a raw TCP send's (measured beside each run): the paired
  ratio worker / (local + 1.5 x send);
- trainer <= 1.5 x raw TCP's receive (ZeroMQ, fast path) and <= 1.0 x grpcio's own (gRPC), on
  R1 and T1, from medians (T1 runs apart; W3's trainer handles a few small batches: its cost is
  per batch, shown, not judged); T1's, judged from creating the iterator on (as its table),
  also gives the same ratio after the first batch, every system's start-up apart (BENCHMARKS.md's
  steady state): start-up is about a tenth of loadax's CPU over T1's 64 batches, and the ratio
  after it much the same;
- (worker + trainer) / local <= 1.6 on R1 and <= 1.15 on W3, paired;
- T1: loadax ZeroMQ, through its fast path or its sockets, >= 0.8 x raw TCP's GB/s;
- the trainer's RSS within its bound (T1's runs); each side's checksum <= 3 % of R1's CPU
  (its share of that side's perf samples times that side's share of the CPU).

Beside three of them it measures, in the same run, the floor this machine sets under them:
local + a raw send + a raw receive over local (total ÷ local over the sockets), one read of an
R1 batch from memory (`cold_checksum_rate`, against the client's checksum on the fast path), and
the client's CPU per batch on 64 KiB batches (`client_per_batch`, against T1's raw receive of
an 8 MiB batch).

    .venv/bin/python benchmarks/cost_per_gb.py --rounds 3 --w3-rounds 12

The section goes into RESULTS.md, with T1's table and target rows from the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from catalog import TITLES
from fleet_sim import RESULTS, write_section
from paired import Paired
from results import Results, cpu_per_gb
from workloads import CROP_SIDE, T1_BATCH_BYTES

from loadax.wire.checksum import payload_checksum
from loadax.wire.v1 import worker_pb2 as wire

HERE = Path(__file__).resolve().parent
TITLE = "Cost per GB: issue 26's targets from one run"
PIPELINE_EPOCHS = {"R1": 2, "W3": 1}
LIMITS = {"R1": 1.6, "W3": 1.15}
"""The most (worker + trainer) CPU per GB may be, as a multiple of the local loader's."""
MODES = (("zmq", False), ("zmq", True), ("grpc", False), ("grpc", True))
"""(transport, over the sockets): the fast path first, then as from another host."""
RUNS = (("local", False), *MODES)
"""A round's runs of a pipeline, in the order of its first round."""
CHECKSUM_SYMBOL = re.compile(r"xxh|sum_of_products", re.IGNORECASE)
"""perf's names for the reply checksum's code (XXH3, or the weighted sums' numpy kernel)."""
CHECKSUM_SHARE = 0.03
MIB = 1 << 20
SMALL_BATCH_BYTES = 64 << 10
"""T1's batches when the client's cost per batch is measured apart from its cost per byte."""
SMALL_BATCHES = 8192
R1_ROW_BYTES = CROP_SIDE * CROP_SIDE * 3 * 4
"""An R1 batch's image row (float32), as a worker stacks it; 64 make a batch."""

Profile = dict[str, Any]


def profile(workload: str, system: str, sockets: bool, *extra: str) -> Profile:
    """One `profile_remote.py` run's measurements (its first output line)."""
    command = [sys.executable, str(HERE / "profile_remote.py"), workload, system, *extra]
    if workload in PIPELINE_EPOCHS:
        command += ["--epochs", str(PIPELINE_EPOCHS[workload])]
    if sockets:
        command.append("--sockets")
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=HERE)
    return dict(json.loads(done.stdout.splitlines()[0]))


def name(system: str, sockets: bool) -> str:
    label = {"zmq": "ZeroMQ", "grpc": "gRPC", "local": "local loader"}[system]
    return label if system == "local" else f"{label} {'sockets' if sockets else 'fast path'}"


def checksum_share(perf_data: Path) -> float:
    """The share of `perf_data`'s samples in the reply checksum's symbols."""
    report = ["perf", "report", "-i", str(perf_data), "--no-children", "-q", "-g", "none"]
    shown = subprocess.run(
        [*report, "--sort", "sym"], capture_output=True, text=True, check=True
    ).stdout
    share = 0.0
    for line in shown.splitlines():
        fields = line.split()
        if fields and fields[0].endswith("%") and CHECKSUM_SYMBOL.search(line):
            share += float(fields[0].rstrip("%")) / 100
    return share


def t1(rounds: int, scratch: Path) -> tuple[Results, Path]:
    """`run.py`'s T1 in this run: its results and its report."""
    out = scratch / "t1.md"
    # At quick scale (64 batches a run), as RESULTS.md's T1 table.
    command = [sys.executable, str(HERE / "run.py"), "--workloads", "T1", "--scale", "quick"]
    subprocess.run([*command, "--rounds", str(rounds), "--out", str(out)], check=True, cwd=HERE)
    return Results(json.loads(out.with_suffix(".json").read_text())), out


def column(profiles: list[Profile], key: str) -> list[float]:
    """`key` of each round's run, in the order of the rounds."""
    return [float(one[key]) for one in profiles]


def median(profiles: list[Profile], key: str) -> float:
    return statistics.median(column(profiles, key))


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="R1's and T1's rounds")
    parser.add_argument("--w3-rounds", type=int, default=12, help="W3's rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-perf", action="store_true", help="skip the checksum's share")
    args = parser.parse_args()
    rounds = {"R1": args.rounds, "W3": args.w3_rounds}
    if min(rounds.values()) < 1:
        parser.error(f"every pipeline needs a round at least: {rounds}")
    started, load_before = time.monotonic(), os.getloadavg()[0]
    runs: dict[tuple[str, str, bool], list[Profile]] = {}
    for round_ in range(max(rounds.values())):
        for workload in (workload for workload in PIPELINE_EPOCHS if round_ < rounds[workload]):
            # Turned by one each round: no path always runs first, or next to the same one.
            turn = round_ % len(RUNS)
            for system, sockets in RUNS[turn:] + RUNS[:turn]:
                measured = profile(workload, system, sockets)
                runs.setdefault((workload, system, sockets), []).append(measured)
                print(f"round {round_ + 1} {workload} {name(system, sockets)}: {measured}")
    with tempfile.TemporaryDirectory(prefix="cost-per-gb-") as directory:
        scratch = Path(directory)
        transports, t1_report = t1(args.rounds, scratch)
        t1_text = t1_report.read_text()
        per_batch = statistics.median(client_per_batch() for _ in range(args.rounds))
        shares, cold_rate = {}, 0.0
        if not args.no_perf:
            cold_rate = cold_checksum_rate()
            for side in ("worker", "client"):
                data = scratch / f"{side}.perf"
                profile("R1", "zmq", False, "--perf", side, "--perf-out", str(data))
                shares[side] = checksum_share(data)
    load_after = os.getloadavg()[0]
    lines = rows(runs, transports, shares, cold_rate, per_batch)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines[:0] = [
        f"`python benchmarks/cost_per_gb.py --rounds {args.rounds} --w3-rounds {args.w3_rounds}` "
        f"({when}, {time.monotonic() - started:.0f} s, {os.cpu_count()} cores shared by the "
        f"worker and the trainer, load average {load_before:.1f} before and {load_after:.1f} "
        "after): medians over the rounds, each run a process of its own, in turn; CPU seconds "
        "per GB of batches, user + system; worker and trainer on the same 2 cores (in a "
        "deployment they are not). Total ÷ local and the worker and total verdicts are medians "
        "of each round's ratio to the local loader's run of the same round, with their 95 % "
        "interval from 6 rounds on.",
        "",
    ]
    print("\n".join(lines))
    write_section(args.out, TITLE, lines)
    if args.out == RESULTS:
        write_t1(t1_text, transports)
    return 0


def client_per_batch() -> float:
    """The client's CPU seconds per batch over ZeroMQ's sockets when batches are small (T1's
    of `SMALL_BATCH_BYTES`): what a batch costs it whatever its size (the reply's checks, the
    fleet's policy, the hand-offs between its threads)."""
    measured = profile(
        "T1",
        "zmq",
        True,
        "--batch-bytes",
        str(SMALL_BATCH_BYTES),
        "--batches",
        str(SMALL_BATCHES),
    )
    return float(measured["client CPU s/GB"]) * SMALL_BATCH_BYTES / 1e9


def cold_checksum_rate(rounds: int = 9) -> float:
    """GB/s of the client's checksum (XXH3 in chunks) over an R1 batch's bytes out of the CPU's
    caches, as the fast path's client reads a batch its worker wrote: the batch written row by
    row (as a worker stacks it), pushed out of the caches by a larger write, then hashed; this
    thread's CPU time, the median of `rounds`."""
    rows = 64
    row = np.random.default_rng(0).integers(0, 256, R1_ROW_BYTES, np.uint8)
    batch = np.empty(rows * R1_ROW_BYTES, np.uint8)
    flush = np.empty(64 * MIB, np.uint8)
    seconds = []
    for _ in range(rounds):
        for at in range(0, batch.size, R1_ROW_BYTES):
            batch[at : at + R1_ROW_BYTES] = row
        flush.fill(1)
        start = time.thread_time()
        payload_checksum([batch.data], wire.CHECKSUM_XXH3_CHUNKS)
        seconds.append(time.thread_time() - start)
    return batch.nbytes / statistics.median(seconds) / 1e9


def rows(
    runs: dict[tuple[str, str, bool], list[Profile]],
    transports: Results,
    shares: dict[str, float],
    cold_rate: float,
    per_batch: float,
) -> list[str]:
    """The section's tables: each pipeline's CPU per GB, then every target's verdict, with
    the floors this machine sets to those missed here: local + a raw send + a raw receive
    (R1 over the sockets), one read of a batch from memory (the client's checksum on the fast
    path), and the client's cost per batch (T1 over ZeroMQ's sockets, `per_batch`)."""
    lines = [
        "| pipeline, path | GB/s | worker s/GB | trainer s/GB | local s/GB | raw send s/GB "
        "| total ÷ local |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts: list[tuple[str, str, str]] = []
    raw_receive = transports.median("T1", "raw TCP", cpu_per_gb) or 0.0
    grpcio = transports.median("T1", "gRPC raw bytes", cpu_per_gb) or 0.0
    for workload, limit in LIMITS.items():
        alone = runs[(workload, "local", False)]
        local = median(alone, "client CPU s/GB")
        local_rounds = column(alone, "client CPU s/GB")
        lines.append(
            f"| {workload} local loader | {median(alone, 'GB/s'):.3f} | — | — | {local:.2f} "
            "| — | 1 |"
        )
        for system, sockets in MODES:
            measured = runs[(workload, system, sockets)]
            worker, trainer = (
                median(measured, f"{side} CPU s/GB") for side in ("worker", "client")
            )
            send = median(measured, "raw TCP send CPU s/GB")
            workers = column(measured, "worker CPU s/GB")
            sends = column(measured, "raw TCP send CPU s/GB")
            bounds = [
                alone_cpu + 1.5 * send_cpu
                for alone_cpu, send_cpu in zip(local_rounds, sends, strict=True)
            ]
            over_bound = Paired.of(workers, bounds)
            totals = Paired.of(
                [
                    one + two
                    for one, two in zip(workers, column(measured, "client CPU s/GB"), strict=True)
                ],
                local_rounds,
            )
            label = f"{workload} {name(system, sockets)}"
            floor_total = statistics.median(
                (alone_cpu + send_cpu + raw_receive) / alone_cpu
                for alone_cpu, send_cpu in zip(local_rounds, sends, strict=True)
            )
            lines.append(
                f"| {label} | {median(measured, 'GB/s'):.3f} | {worker:.2f} | {trainer:.2f} "
                f"| {local:.2f} | {send:.3f} | {totals.median:.2f} |"
            )
            verdicts.append(
                (
                    f"{label}: worker ≤ local + 1.5 x raw send",
                    f"{worker:.2f} vs {local + 1.5 * send:.2f} s/GB (medians); paired "
                    f"worker ÷ bound {over_bound.describe()}",
                    over_bound.verdict(1.0),
                )
            )
            floor_note = (
                f"; local + a raw send + a raw receive (T1's), this machine's floor: "
                f"{floor_total:.2f}"
                if sockets and raw_receive
                else ""
            )
            verdicts.append(
                (
                    f"{label}: total ÷ local ≤ {limit}",
                    f"paired {totals.describe()}{floor_note}",
                    totals.verdict(limit),
                )
            )
            floor, times, what = (
                (grpcio, 1.0, "grpcio's own receive")
                if system == "grpc"
                else (raw_receive, 1.5, "raw TCP's receive")
            )
            if floor and workload == "R1":  # W3's few small batches: per batch, not per byte
                verdicts.append(
                    (
                        f"{label}: trainer ≤ {times} x {what}",
                        f"{trainer / floor:.2f}x ({trainer:.3f} vs {floor:.3f} s/GB, T1)",
                        verdict(trainer <= times * floor),
                    )
                )
    verdicts += transport_verdicts(transports, raw_receive, grpcio, per_batch)
    profiled = runs[("R1", "zmq", False)]
    cpu = {side: median(profiled, f"{side} CPU s/GB") for side in ("worker", "client")}
    for side, share in shares.items():
        of_r1 = share * cpu[side] / sum(cpu.values())
        shown = f"{of_r1:.1%} ({share:.1%} of the {side}'s perf samples)"
        if side == "client" and cold_rate:
            shown += (
                f"; one read of a batch from memory (XXH3 at {cold_rate:.0f} GB/s here) is "
                f"{1 / cold_rate / sum(cpu.values()):.1%} of R1's CPU"
            )
        verdicts.append(
            (
                f"R1 ZeroMQ fast path: the {side}'s checksum ≤ 3 % of R1's CPU",
                shown,
                verdict(of_r1 <= CHECKSUM_SHARE),
            )
        )
    return [
        *lines,
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *(f"| {target} | {measured} | {result} |" for target, measured, result in verdicts),
    ]


def steady_cpu_per_gb(run: Mapping[str, Any]) -> float:
    """A T1 run's CPU seconds per GB after its first batch: its start-up (connecting, the
    handshake, threads, the first requests) apart, as BENCHMARKS.md reports a steady state."""
    seconds = float(run["cpu_s"]) - float(run["first_batch_cpu_s"])
    return seconds / (float(run["bytes"]) - float(run["first_batch_bytes"])) * 1e9


def transport_verdicts(
    transports: Results, raw_receive: float, grpcio: float, per_batch: float
) -> list[tuple[str, str, str]]:
    """T1's: the trainer's receive against the raw ones (over ZeroMQ's sockets with the
    client's CPU `per_batch` beside it), GB/s against raw TCP, RSS bounds."""
    verdicts = []
    raw_rate = transports.median("T1", "raw TCP") or 0.0

    def gb_per_s(system: str) -> float:
        return transports.median("T1", system) or 0.0

    floors = {"raw TCP": raw_receive, "gRPC raw bytes": grpcio}
    for system, floor_system, times in (
        ("loadax ZeroMQ", "raw TCP", 1.5),
        ("loadax ZeroMQ sockets", "raw TCP", 1.5),
        ("loadax gRPC sockets", "gRPC raw bytes", 1.0),
    ):
        trainer = transports.median("T1", system, cpu_per_gb) or 0.0
        floor = floors[floor_system]
        if floor and trainer:
            steady = transports.median("T1", system, steady_cpu_per_gb) or 0.0
            steady_floor = transports.median("T1", floor_system, steady_cpu_per_gb) or 0.0
            measured = (
                f"{trainer / floor:.2f}x ({trainer:.3f} vs {floor:.3f} s/GB; after the "
                f"first batch {steady / steady_floor:.2f}x)"
            )
            if system == "loadax ZeroMQ sockets" and per_batch:
                raw_batch = floor * T1_BATCH_BYTES["T1"] / 1e9
                measured += (
                    f"; its CPU per batch at {SMALL_BATCH_BYTES >> 10} KiB batches "
                    f"{per_batch * 1e3:.2f} ms, {per_batch / raw_batch:.2f}x the raw receive "
                    f"of an {T1_BATCH_BYTES['T1'] >> 20} MiB batch ({raw_batch * 1e3:.2f} ms)"
                )
            verdicts.append(
                (
                    f"T1 {system}: trainer ≤ {times} x the raw receive",
                    measured,
                    verdict(trainer <= times * floor),
                )
            )
    best = max(("loadax ZeroMQ", "loadax ZeroMQ sockets"), key=gb_per_s)
    if raw_rate and gb_per_s(best):
        verdicts.append(
            (
                "T1: ZeroMQ (or its fast path) ≥ 0.8 x raw TCP GB/s",
                f"{gb_per_s(best) / raw_rate:.2f}x ({best} {gb_per_s(best):.2f} vs "
                f"{raw_rate:.2f} GB/s)",
                verdict(gb_per_s(best) >= 0.8 * raw_rate),
            )
        )
    bounded = [
        run
        for system in transports.systems.get("T1", [])
        for run in transports.runs("T1", system["name"])
        if run.get("memory_bound_bytes") is not None
    ]
    if bounded:
        over = [run for run in bounded if run["peak_rss_bytes"] > run["memory_bound_bytes"]]
        overs = ", ".join(
            f"{run['system']} by {(run['peak_rss_bytes'] - bound) / MIB:.1f} MiB"
            for run in over
            if (bound := run["memory_bound_bytes"])
        )
        verdicts.append(
            (
                "T1: the trainer's RSS within its bound",
                f"{len(bounded) - len(over)} of {len(bounded)} runs within"
                + (f" (over: {overs})" if over else ""),
                verdict(not over),
            )
        )
    return verdicts


def write_t1(report: str, transports: Results) -> None:
    """RESULTS.md's T1 table and T1 target rows, from this run's T1 report."""
    title = TITLES["T1"].format(**transports.workloads["T1"])
    start = report.index(f"## {title}")
    end = report.find("\n## ", start + 1)
    section = report[start : None if end < 0 else end].splitlines()[2:]
    write_section(RESULTS, title, section)
    # Only 8 MiB ran: T1-64M's rows keep their own run's numbers.
    new = {row.split(" | ")[0]: row for row in report.splitlines() if row.startswith("| T1 8 MiB")}
    lines = [new.get(line.split(" | ")[0], line) for line in RESULTS.read_text().splitlines()]
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
