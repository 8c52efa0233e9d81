"""The benchmark suite (benchmarks/run.py) runs loadax's own systems end to end, tiny, and writes
every run's record and the Markdown table; the peers' environments are not needed for that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "run.py"
SYSTEMS = {
    "W1": ["loadax 0w", "loadax 2w"],
    "R1": ["loadax ZeroMQ 1w", "loadax 2w"],  # loadax 2w is R1's local mode too
    "T1": ["loadax gRPC"],
    "codec": ["loadax.wire.codec encode"],
    "P1": ["Plan.indices batch 4096"],
    "R2": ["loadax ZeroMQ 1w 5ms", "loadax gRPC 2w 5ms", "loadax gRPC 2w 20ms SIGSTOP"],
}
REMOTE = {"loadax ZeroMQ 1w", "loadax gRPC"}
FAULT = "loadax gRPC 2w 20ms SIGSTOP"
ROUNDS = 2


def test_suite_alternates_loadax_systems_and_writes_positive_records_and_a_table(
    tmp_path: Path,
) -> None:
    out, work, scratch = tmp_path / "RESULTS.md", tmp_path / "work", tmp_path / "tmp"
    scratch.mkdir()
    command = [
        *(sys.executable, str(RUN), "--scale", "smoke", "--rounds", str(ROUNDS)),
        *("--workloads", ",".join(SYSTEMS)),
        *("--systems", ",".join({name for names in SYSTEMS.values() for name in names})),
        *("--out", str(out), "--work-dir", str(work)),
    ]
    # Every worker's config lies under TMPDIR: a process naming it afterwards was left behind.
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(scratch)},
        check=False,
    )

    assert result.returncode == 0, result.stderr
    document = json.loads(out.with_suffix(".json").read_text())
    runs = document["runs"]
    # Within each workload, every round runs each system once, in the same order: A B A B.
    assert [(run["workload"], run["round"], run["system"]) for run in runs] == [
        (workload, round_number, name)
        for workload, names in SYSTEMS.items()
        for round_number in range(1, ROUNDS + 1)
        for name in names
    ]
    for run in runs:
        assert run["status"] == "ok", run
        for key in ("elements", "bytes", "seconds", "elements_per_s", "bytes_per_s", "cpu_s"):
            assert run[key] > 0, (key, run)
        assert run["minor_faults"] >= 0
        assert run["peak_rss_bytes"] >= run["base_rss_bytes"] > 0
        assert run["first_batch_s"] <= run["seconds"]
        assert 0 <= run["first_batch_cpu_s"] <= run["cpu_s"]
        assert 0 < run["first_batch_bytes"] <= run["bytes"]
    remote = [run for run in runs if run["system"] in REMOTE]
    for run in remote:  # the bound is base + (prefetch + 2) batches
        extra_batches = run["extra"]["prefetch"] + 2
        expected = run["base_rss_bytes"] + extra_batches * run["batch_bytes"]
        assert run["memory_bound_bytes"] == expected
    assert all(run["memory_bound_bytes"] is None for run in runs if run not in remote)
    fleet = [run for run in runs if run["workload"] == "R2"]
    assert all(run["extra"]["build_s"] > 0 for run in fleet)
    for run in (run for run in fleet if run["system"] == FAULT):
        # The worker was stopped after the first of the 4 batches, and batches came after it.
        assert run["extra"]["fault_after_batches"] == 1
        assert run["extra"]["gap_after_fault_s"] > 0
        assert "gap_capped" in run["extra"]
    assert _processes_naming(scratch) == []  # the stopped worker too
    # Only loadax's own environment was used: no peer virtualenv was made.
    assert sorted(path.name for path in work.iterdir()) == ["data"]

    table = out.read_text()
    assert "## Targets" in table
    assert "| W1: loadax ≥ 3x the best peer | not measured | — |" in table
    assert "| R1: ZeroMQ ≥ 0.8x local mode | " in table
    assert "| R1: ZeroMQ ≥ 0.8x local mode | not measured" not in table
    assert "| R1: gRPC ≥ 0.6x local mode | not measured | — |" in table
    for names in SYSTEMS.values():
        for name in names:
            assert f"| **{name}** | " in table
    assert "## W3 CPU-heavy" not in table  # W3 was not run: no table of its own
    assert "| system | GB/s (median) | min - max | CPU s/GB | faults/GB | " in table  # T1
    fault_target = "| R2: no gap > 2 s between batches after a fault of 1 of 2 workers | "
    assert f"{fault_target}gRPC SIGSTOP " in table
    assert "| R2: scaling efficiency ≥ 90% at 8 workers (20 ms) | not measured | — |" in table
    lines = table.splitlines()
    scaling = next(i for i, line in enumerate(lines) if line.startswith("| transport | cost | 1 "))
    scaling_row = next(line for line in lines[scaling:] if line.startswith("| ZeroMQ | 5 ms |"))
    one_worker = scaling_row.split(" | ")[2]
    assert one_worker not in ("—", "failed"), scaling_row  # a rate, from the 1-worker run


def _processes_naming(path: Path) -> list[str]:
    """The command lines of running processes that mention `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue  # not a process, or gone meanwhile
        if str(path) in command:
            found.append(command)
    return found
