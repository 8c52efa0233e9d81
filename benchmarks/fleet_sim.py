"""A fleet simulator on the client's real placement policy: W simulated workers and T trainer
hosts, each trainer with its own `loadax.client.policy.Policy`, on a virtual clock
(`fleet_sim_run.py`; the workers and faults are in `fleet_sim_world.py`).

Usage: `python benchmarks/fleet_sim.py --workers W --trainers T --seconds S [--stragglers 0.05]
[--straggler-factor 10] [--kill 0.1] [--kill-at S] [--service-ms 20] [--step-ms 100]
[--threads N] [--seed N] --json PATH` (also --hang, --slow, --add, --remove, --rename, each
with its -at); it prints a one-line summary. Deterministic for a seed (wall_s and the policy's
CPU aside).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fleet_sim_run import Simulation
from fleet_sim_world import FAULT_KINDS, Fault, World

from loadax.client.fleet_options import FleetOptions

FLEET = Path(__file__).with_name("FLEET.md")
"""Where the simulator's sections live (`benchmarks/report.py` puts them into RESULTS.md)."""
RESULTS = Path(__file__).with_name("RESULTS.md")
RESULTS_BEFORE = "## Why the missed transport targets are missed"
"""A section new to RESULTS.md goes before this one (where FLEET.md's sections are)."""


def policy_version() -> str:
    """The commit the policy is at (`client/`), and whether it has uncommitted changes."""
    root = Path(__file__).resolve().parents[1]

    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("log", "-1", "--format=%h", "--", "client") or "unknown"
    return commit + (" + uncommitted changes" if git("status", "--short", "--", "client") else "")


def write_section(path: Path, title: str, lines: list[str]) -> None:
    """Put `lines` under `## title` in the markdown file `path` (by default FLEET.md, and then
    RESULTS.md's copy too, so that the report is current before `benchmarks/run.py` renders
    it again): in place of that section's text, or as a new section (before `RESULTS_BEFORE`
    in RESULTS.md, at the end of another file)."""
    section = "\n".join([f"## {title}", "", *lines]).rstrip() + "\n"
    for each in (path, RESULTS) if path == FLEET else (path,):
        each.write_text(_with_section(each.read_text() if each.exists() else "", title, section))


def _with_section(text: str, title: str, section: str) -> str:
    heading = f"## {title}"
    found = 0 if text.startswith(f"{heading}\n") else text.find(f"\n{heading}\n") + 1
    if found > 0 or text.startswith(f"{heading}\n"):
        end = text.find("\n## ", found + 1)
        rest = "" if end < 0 else text[end + 1 :]
        return text[:found] + section + ("\n" + rest if rest else "")
    if (at := text.find(f"\n{RESULTS_BEFORE}\n")) >= 0:
        return text[: at + 1] + section + "\n" + text[at + 1 :]
    return text.rstrip() + ("\n\n" if text else "") + section


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--trainers", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True, help="of virtual time")
    parser.add_argument("--threads", type=int, default=8, help="loading slots per worker")
    parser.add_argument("--service-ms", type=float, default=20.0, help="per batch")
    parser.add_argument("--service-sigma", type=float, default=0.0, help="lognormal; 0: fixed")
    parser.add_argument("--stragglers", type=float, default=0.0, help="share of the workers")
    parser.add_argument("--straggler-factor", type=float, default=10.0)
    parser.add_argument("--step-ms", type=float, default=100.0, help="training step")
    parser.add_argument("--step-spread", type=float, default=0.0, help="+- share between trainers")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="network round trip")
    parser.add_argument("--loss-ms", type=float, default=100.0, help="to notice a lost connection")
    parser.add_argument("--limit", type=int, default=16, help="each worker's per-client limit")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--in-flight-per-worker", type=int, default=2)
    for kind in FAULT_KINDS:
        what = "workers added" if kind == "add" else f"share of the workers to {kind}"
        parser.add_argument(f"--{kind}", type=float, default=None, help=what)
        parser.add_argument(f"--{kind}-at", type=float, default=None, help="default: half-way")
    parser.add_argument("--slow-factor", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--digests", action="store_true", help="requests carry digests (placement's tie-break)"
    )
    parser.add_argument("--json", type=Path, required=True, help="where the report goes")
    return parser.parse_args(argv)


def world_from(args: argparse.Namespace) -> World:
    faults = tuple(
        Fault(
            kind,
            args.seconds / 2
            if getattr(args, f"{kind}_at") is None
            else getattr(args, f"{kind}_at"),
            getattr(args, kind),
            args.slow_factor if kind == "slow" else 1.0,
        )
        for kind in FAULT_KINDS
        if getattr(args, kind) is not None
    )
    return World(
        workers=args.workers,
        trainers=args.trainers,
        seconds=args.seconds,
        threads=args.threads,
        service_s=args.service_ms / 1000,
        service_sigma=args.service_sigma,
        stragglers=args.stragglers,
        straggler_factor=args.straggler_factor,
        step_s=args.step_ms / 1000,
        step_spread=args.step_spread,
        rtt_s=args.rtt_ms / 1000,
        loss_s=args.loss_ms / 1000,
        limit=args.limit,
        prefetch=args.prefetch,
        seed=args.seed,
        faults=faults,
        digests=args.digests,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        world = world_from(args)
        options = FleetOptions(in_flight_per_worker=args.in_flight_per_worker)
    except ValueError as error:
        print(f"fleet_sim: {error}", file=sys.stderr)
        return 2
    report = Simulation(world, options).run()
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{world.workers} workers x {world.trainers} trainers x {world.seconds:g} s: "
        f"delivered {report['delivered_fraction']:.3f}, stall {report['stall_fraction']:.3f}, "
        f"gap p50/p99/max {_seconds(report['p50_gap_s'])}/{_seconds(report['p99_gap_s'])}/"
        f"{_seconds(report['max_gap_s'])} s, "
        f"extra load {report['extra_load']:.3f}, spread {report['load_spread']:.2f}, "
        f"connections per trainer {report['connections_per_trainer_end_max']} at the end "
        f"(cap {report['connections_cap']}, {report['connections_per_trainer_max']} at most), "
        f"{report['decisions']} decisions at "
        f"{report['policy_cpu_per_decision_s'] * 1e6:.1f} us, wall {report['wall_s']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
