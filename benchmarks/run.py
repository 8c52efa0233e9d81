"""The benchmark suite: loadax against its peers on every workload (W1-W3 local loading, R1
remote, T1 and T1-64M transport, codec, P1 planner, R2 fleet), each a ratio measured in the same
rounds.

Usage: `python benchmarks/run.py [--quick] [--workloads W1,R1] [--systems "loadax 2w,tf.data"]
[--rounds N] [--out benchmarks/RESULTS.md]`. Peers run in virtualenvs under .bench/ made with pip
on first use (a peer pip cannot install is reported unavailable, with pip's reason); loadax runs
in this interpreter's environment. Every run is its own process, systems alternate within each
round, and the table is written with every run's record beside it (RESULTS.json). Exits 1 if a
loadax run failed. A run is a process group of its own, killed after it: nothing a run starts
(R2's fault runs start their own workers) outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import catalog
import environments
import report
from catalog import System
from progress import Progress
from services import Services, child_env
from workloads import SCALES, WORKLOADS, Workload, prepare, workload

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
DEFAULT_ROUNDS = {"full": 3, "quick": 1, "smoke": 1}
STARTUP_ALLOWANCE_S = 300.0
"""How long a run may take beyond its workload's own limit (imports, set-up, tear-down)."""
ERROR_CHARS = 4000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller workloads, one round (a few minutes)"
    )
    parser.add_argument("--scale", choices=SCALES, help="full (default), quick, or smoke (tests)")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated (default: all)"
    )
    parser.add_argument("--systems", help="comma-separated system names (default: all)")
    parser.add_argument("--rounds", type=int, help="rounds per workload (default 3, quick 1)")
    parser.add_argument("--out", type=Path, default=BENCHMARKS / "RESULTS.md")
    parser.add_argument("--json", type=Path, help="every run's record (default: --out as .json)")
    parser.add_argument(
        "--work-dir", type=Path, default=ROOT / ".bench", help="data files and peer virtualenvs"
    )
    args = parser.parse_args(argv)
    if args.quick and args.scale not in (None, "quick"):
        parser.error(f"--quick contradicts --scale {args.scale}")
    args.scale = "quick" if args.quick else args.scale or "full"
    args.rounds = DEFAULT_ROUNDS[args.scale] if args.rounds is None else args.rounds
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    args.json = args.json or args.out.with_suffix(".json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, load_before = time.monotonic(), _load()
    try:
        selected = catalog.select(
            _names(args.workloads), _names(args.systems) if args.systems else None
        )
    except ValueError as error:
        print(f"run.py: {error}", file=sys.stderr)
        return 2
    specs = {name: workload(name, args.scale, args.work_dir / "data") for name in selected}
    progress = Progress(args.rounds * sum(len(systems) for systems in selected.values()))
    envs = {
        name: environments.ensure(name, requirements, args.work_dir, progress.note)
        for name, requirements in catalog.ENVIRONMENTS.items()
        if any(system.env == name for systems in selected.values() for system in systems)
    }
    for spec in specs.values():
        if spec.data is not None and not spec.data.is_file():
            progress.note(f"writing {spec.data} (once)")
            prepare(spec)
    peers = envs.get(catalog.PEERS_ENV)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loadax-bench-") as scratch:
        services = Services(Path(scratch), specs, None if peers is None else peers.python)
        try:
            for name, systems in selected.items():
                runs += _run_workload(specs[name], systems, args, envs, services, progress)
        finally:
            services.stop()
    progress.finish()
    meta = {
        "command": shlex.join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "scale": args.scale,
        "rounds": args.rounds,
        "wall_s": time.monotonic() - started,
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}",
        "load_before": load_before,
        "load_after": _load(),
        "max_seconds": next(iter(specs.values())).max_seconds,
    }
    document = {
        "meta": meta,
        "workloads": {
            name: {"records": s.records, "batch_size": s.batch_size} for name, s in specs.items()
        },
        "systems": {
            name: [_describe(system) for system in systems] for name, systems in selected.items()
        },
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=1) + "\n")
    args.out.write_text(report.render(document))
    print(f"wrote {args.out} and {args.json} in {meta['wall_s']:.0f} s")
    failed = [run for run in runs if run["status"] == "failed" and run["role"] == "loadax"]
    for run in failed:
        what = f"{run['workload']} {run['system']}"
        print(f"loadax run failed: {what}: {run['reason']}", file=sys.stderr)
    return 1 if failed else 0


def _run_workload(
    spec: Workload,
    systems: tuple[System, ...],
    args: argparse.Namespace,
    envs: dict[str, environments.Environment],
    services: Services,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Every round of every system of one workload, alternating; unavailable ones once, unrun."""
    runs, available = [], []
    for system in systems:
        reason = _unavailable(system, envs)
        if reason is None:
            available.append(system)
        else:
            runs.append({**_base(spec, system), "status": "unavailable", "reason": reason})
            for _ in range(args.rounds):
                progress.step(f"{spec.name} {system.name}: unavailable")
    for round_number in range(1, args.rounds + 1):
        for system in available:
            progress.step(f"{spec.name} {system.name} (round {round_number}/{args.rounds})")
            run = _run_one(spec, system, args, envs, services)
            runs.append({**run, "round": round_number})
            if run["status"] == "failed":
                progress.note(f"{spec.name} {system.name} failed: {run['reason']}")
    return runs


def _run_one(
    spec: Workload,
    system: System,
    args: argparse.Namespace,
    envs: dict[str, environments.Environment],
    services: Services,
) -> dict[str, Any]:
    base = _base(spec, system)
    try:
        options = {} if system.service is None else services.options(system.service)
    except (RuntimeError, OSError) as error:
        return {**base, "status": "failed", "reason": f"{system.service}: {error}"}
    python = sys.executable if system.env is None else str(envs[system.env].python)
    with tempfile.TemporaryDirectory(prefix="loadax-run-") as directory:
        record = Path(directory) / "record.json"
        command = [
            python,
            str(BENCHMARKS / system.script),
            *("--workload", spec.name, "--system", system.name, "--scale", args.scale),
            *("--data", str(args.work_dir / "data"), "--record", str(record)),
            *(f"--option={key}={value}" for key, value in options.items()),
        ]
        started = time.monotonic()
        limit = spec.max_seconds + STARTUP_ALLOWANCE_S
        try:
            result = _run_group(command, directory, limit)
        except subprocess.TimeoutExpired:
            return {**base, "status": "failed", "reason": f"no result within {limit:.0f} s"}
        process_s = time.monotonic() - started
        if result.returncode != 0 or not record.is_file():
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            return {
                **base,
                "status": "failed",
                "reason": lines[-1] if lines else f"exit status {result.returncode}",
                "stderr": result.stderr[-ERROR_CHARS:],
            }
        numbers = json.loads(record.read_text())
    return {**base, **numbers, "status": "ok", "process_s": process_s}


def _run_group(
    command: list[str], directory: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run `command` as a process group of its own; then kill whatever of the group is left
    (a worker a crashed or timed-out run started, stopped ones included)."""
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=directory,
        process_group=0,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _base(spec: Workload, system: System) -> dict[str, Any]:
    return {"workload": spec.name, "system": system.name, "role": system.role}


def _unavailable(system: System, envs: dict[str, environments.Environment]) -> str | None:
    if system.env is None or system.package is None:
        return None
    return envs[system.env].reason(system.package)


def _describe(system: System) -> dict[str, Any]:
    return {"name": system.name, "role": system.role, "package": system.package}


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
