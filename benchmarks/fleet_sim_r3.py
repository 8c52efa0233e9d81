"""R3 (simulated): the fleet at scale on the fleet simulator (`fleet_sim.py`, the client's real
policy): 100 / 1,000 / 10,000 workers x 1 / 16 / 256 trainers, uniform, with 5 % stragglers at
10x, and with 10 % of the workers killed at once; against the targets of issue 25's item 7.

Usage: `python benchmarks/fleet_sim_r3.py [--timeout S] [--out benchmarks/FLEET.md]`: each
case is its own `fleet_sim.py` process (run with `nice`); then the table goes into the "R3
fleet at scale (simulated)" section of `--out` and the plot into benchmarks/r3.png. A case over
`--timeout` is reported as such.

Each trainer steps every 50 ms (20 batches/s); a worker has 2 loading slots of 250 ms a batch
(8 batches/s): a trainer wants 2.5 workers' worth, so 1,000 workers serve 256 trainers at 64 %
of their capacity, and 100 workers cannot serve 256 (the plot shows where that starts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleet_sim import FLEET, policy_version, write_section

BENCHMARKS = Path(__file__).resolve().parent
WORKERS = (100, 1_000, 10_000)
TRAINERS = (1, 16, 256)
SECONDS, KILL_AT = 20.0, 10.0
SHAPE = ["--threads", "2", "--service-ms", "250", "--step-ms", "50"]
SCENARIOS = {
    "uniform": [],
    "5 % stragglers at 10x": ["--stragglers", "0.05", "--straggler-factor", "10"],
    "10 % killed at once": ["--kill", "0.1", "--kill-at", str(KILL_AT)],
}
TARGET = (1_000, 256)
SECTION = "R3 fleet at scale (simulated)"


def run_case(
    workers: int, trainers: int, scenario: str, timeout: float, folder: Path
) -> dict[str, Any]:
    """One case's report (`fleet_sim.py`'s JSON, written in `folder`), or {"timed_out": ...}."""
    out = folder / f"{workers}x{trainers}-{scenario.split()[0]}.json"
    command = ["nice", sys.executable, str(BENCHMARKS / "fleet_sim.py")]
    command += ["--workers", str(workers), "--trainers", str(trainers)]
    command += ["--seconds", str(SECONDS), *SHAPE, *SCENARIOS[scenario], "--json", str(out)]
    try:
        subprocess.run(command, check=True, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"timed_out": timeout}
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row(workers: int, trainers: int, scenario: str, report: dict[str, Any]) -> str:
    head = f"| {workers:,} | {trainers} | {scenario} |"
    if "timed_out" in report:
        return head + f" not done in {report['timed_out']:g} s |" + " |" * 10
    gap = report["max_gap_after_fault_s"] if "kill" in scenario else report["max_gap_s"]
    cells = [
        f"{_cell(report['delivered_fraction'], '.3f')} "
        f"({_cell(report['delivered_fraction_min'], '.3f')})",
        _cell(report["stall_fraction"], ".3f"),
        f"{_cell(report['p50_gap_s'], '.3f')} / {_cell(report['p99_gap_s'], '.3f')}",
        _cell(gap, ".2f"),
        _cell(report["extra_load"], ".3f"),
        f"{report['connections_per_trainer_end_max']} ({report['connections_per_trainer_max']})",
        f"{report['connections_per_worker_end_max']} ({report['connections_per_worker_max']})",
        _cell(report["load_spread"], ".2f"),
        _cell(report["policy_cpu_per_decision_s"] * 1e6, ".1f"),
        _cell(report["wall_s"], ".0f"),
    ]
    return head + " " + " | ".join(cells) + " |"


def targets(reports: dict[tuple[int, int, str], dict[str, Any]]) -> list[str]:
    """Item 7's targets at 1,000 x 256, each with what was simulated and whether it is met (by
    how much it is missed), and where a missed load spread comes from."""
    stragglers = reports[(*TARGET, "5 % stragglers at 10x")]
    killed = reports[(*TARGET, "10 % killed at once")]
    if "timed_out" in stragglers or "timed_out" in killed:
        return ["The target cases did not finish: no verdict."]
    p50, p99 = stragglers["p50_gap_s"], stragglers["p99_gap_s"]
    cap = stragglers["connections_cap"]
    # (target, simulated, its limit, whether it must stay at or below it, how to show them)
    checks = [
        ("delivered ≥ 95 % of demand", stragglers["delivered_fraction"], 0.95, False, ".1%"),
        ("p99 gap ≤ 2 x p50 (s)", p99, 2 * p50, True, ".3f"),
        ("extra load ≤ 10 %", stragglers["extra_load"], 0.1, True, ".1%"),
        (
            f"connections per trainer ≤ the cap ({cap}), at any time",
            stragglers["connections_per_trainer_max"],
            cap,
            True,
            "d",
        ),
        ("load spread ≤ 1.2", stragglers["load_spread"], 1.2, True, ".2f"),
        (
            "after killing 10 %, no trainer's gap > 2 s",
            killed["max_gap_after_fault_s"],
            2.0,
            True,
            ".2f",
        ),
    ]
    lines = ["| target (1,000 x 256, 5 % stragglers) | simulated | verdict |", "|---|---|---|"]
    for what, got, limit, at_most, spec in checks:
        met = got <= limit if at_most else got >= limit
        verdict = "met" if met else f"**missed** by {format(abs(got - limit), spec)}"
        lines.append(f"| {what} | {format(got, spec)} | {verdict} |")
    return lines + diagnoses(stragglers)


def diagnoses(report: dict[str, Any]) -> list[str]:
    """The least-fed trainer, and where a missed delivery or load spread comes from, from the
    target case's report (with the policy rules read at the commits named)."""
    lines = [
        "",
        f"The least-fed trainer got {report['delivered_fraction_min']:.1%} of its demand; the "
        f"longest gap, {report['max_gap_s']:.2f} s, ended at {report['max_gap_ended_at_s']:.2f} s"
        f" (the last first batch came at {report['first_batch_max_s']:.2f} s).",
    ]
    if report["delivered_fraction"] < 0.95:
        lines[-1] += (
            " Traced at `client/` 0bea462 (fixed at bf4b1db: the share now accrues with time): "
            "in the first seconds a trainer sends a request to a "
            "straggler that other trainers have queued up (it sees only its own attempts), "
            "spends its extra attempts (`EXTRA_SHARE`: each first attempt earns 0.1 of one, at "
            "most `EXTRA_BURST`) on the start-up's hedges, and, its loop stalled on that "
            "request, submits no first attempt to earn another: the request is hedged only "
            "once it is given up as hung (`HUNG_FACTOR` x p95) or answered. The first batch "
            "(250 ms) is also 1.25 % of the run."
        )
    if report["load_spread"] > 1.2:
        lines += [
            "",
            "Load spread: the apertures' cover of the workers (each worker's shares of them, "
            f"summed every 0.5 s) spreads {report['cover_spread']:.2f} (max ÷ mean), the "
            "requests a worker took per unit of that cover "
            f"{report['requests_per_cover_spread']:.2f}: the spread is in how the trainers "
            "spread their requests over their apertures. Taken apart on the simulator at "
            "`client/` bf4b1db: (1) a straggler's share goes to the other members of each arc "
            "holding it (an arc of 8 with one straggler sends each other member 8/7 of its "
            "share, with two 8/6), so the workers beside stragglers take 1.3-1.5x the mean, "
            "while without stragglers the same trainers spread 1.09-1.12 when placement "
            "ignores latency (`ALIKE` 3); (2) with `ALIKE` 0.25 a member whose latency was "
            "once high is passed over until its estimate goes stale (10 s), so some members of "
            "an arc take a tenth of their share. Tried and not kept: arcs that reach past slow "
            "members (their share lands on the next member of each arc: spread 1.44-1.50), "
            "and wider arcs (16: 1.22-1.29, 24: 1.16, but each straggler in an arc costs its "
            "trainer a hedge's wait: delivered 0.92-0.89). At e956931 the busiest worker "
            "(1.38) sits among 4 stragglers within 17 places of the ring, where arcs of 9 hold "
            "2-3 each; the other non-straggling workers spread 0.25 / 0.80 / 1.08 / 1.22 / "
            "1.27 (1st / 10th / 50th / 90th / 99th percentile). Tried then and not kept: a "
            "member's latency decaying towards the fastest's in 1 s (percentiles 0.89 / 0.98 / "
            "1.02 / 1.15 / 1.23, but the busiest stays at 1.39 and the stragglers take 2.3x "
            "the requests: least trainer 0.86); members over 3x the median latency taking no "
            "width, as failing ones (1.43); arcs at least 16 or 24 wide (1.42 / 1.44, "
            "delivered 0.93 / 0.90).",
        ]
    return lines


def plot(reports: dict[tuple[int, int, str], dict[str, Any]], path: Path) -> None:
    # The benchmarks extra: only the plot needs it.
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    from matplotlib import pyplot  # type: ignore[import-not-found, unused-ignore]

    figure, (delivered, gaps) = pyplot.subplots(1, 2, figsize=(10, 4))
    for colour, trainers in enumerate(TRAINERS):
        for scenario, style in (("5 % stragglers at 10x", "-o"), ("uniform", ":x")):
            done = [
                (workers, reports[(workers, trainers, scenario)])
                for workers in WORKERS
                if "timed_out" not in reports[(workers, trainers, scenario)]
            ]
            label = f"{trainers} trainers, {scenario}"
            xs = [workers for workers, _ in done]
            line = {"label": label, "color": f"C{colour}"}
            delivered.plot(xs, [r["delivered_fraction"] for _, r in done], style, **line)
            gaps.plot(xs, [r["p99_gap_s"] or float("nan") for _, r in done], style, **line)
    delivered.set(xscale="log", xlabel="workers", ylabel="delivered ÷ demand", ylim=(0, 1.05))
    gaps.set(xscale="log", yscale="log", xlabel="workers", ylabel="p99 gap between batches (s)")
    delivered.legend(fontsize=7)
    figure.suptitle("R3 (simulated): each trainer wants 20 batches/s, a worker makes 8")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    parser.add_argument("--out", type=Path, default=FLEET)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    reports: dict[tuple[int, int, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="loadax-r3-") as folder:
        for workers in WORKERS:
            for trainers in TRAINERS:
                for scenario in SCENARIOS:
                    report = run_case(workers, trainers, scenario, args.timeout, Path(folder))
                    reports[(workers, trainers, scenario)] = report
                    print(row(workers, trainers, scenario, report), flush=True)
    plot(reports, BENCHMARKS / "r3.png")
    header = [
        "| workers | trainers | case | delivered (least trainer) | stall | gap p50 / p99 (s) "
        "| longest gap (s) | extra load | connections per trainer, end (max) "
        "| per worker, end (max) "
        "| load spread | policy µs per decision | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    intro = [
        f"`python benchmarks/fleet_sim_r3.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f", {time.perf_counter() - started:.0f} s, `client/` at {policy_version()}): each case "
        f"{SECONDS:g} s of virtual time on the fleet simulator (the client's real policy, its "
        "default options: subset 64). Each trainer steps every 50 ms (wants 20 batches/s); "
        "each worker has 2 loading slots of 250 ms a batch (makes 8/s): a trainer wants 2.5 "
        "workers' worth, so 1,000 workers serve 256 trainers at 64 % of their capacity (100 "
        "workers: 16 trainers at 40 %, 256 at 640 %: they cannot). Stragglers are 10x slower; "
        f"the kill is at {KILL_AT:g} s, and its longest gap is of those after it. Connections: "
        "at the end, and in brackets the most at any time. Load spread: the most requests a "
        "worker took ÷ the mean, over the workers up throughout (where the trainers' apertures "
        "together are narrower than the fleet, e.g. 1 trainer of at most 64 connections, most "
        "workers are unused by design). Delivered counts from the start: the first batch "
        "(250 ms) is 1.25 % of a 20 s run. The policy CPU per decision and the wall time are "
        "of a machine shared with other work.",
    ]
    write_section(
        args.out,
        SECTION,
        [
            *intro,
            "",
            *header,
            *(row(*key, report) for key, report in reports.items()),
            "",
            *targets(reports),
            "",
            "![R3: delivered fraction and p99 gap against workers](r3.png)",
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
