"""The benchmark suite (benchmarks/run.py) runs loadax's own systems end to end, tiny, and writes
every run's record and the Markdown table; the peers' environments are not needed for that."""

from __future__ import annotations

import json
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
}
REMOTE = {"loadax ZeroMQ 1w", "loadax gRPC"}
ROUNDS = 2


def test_suite_alternates_loadax_systems_and_writes_positive_records_and_a_table(
    tmp_path: Path,
) -> None:
    out, work = tmp_path / "RESULTS.md", tmp_path / "work"
    command = [
        *(sys.executable, str(RUN), "--scale", "smoke", "--rounds", str(ROUNDS)),
        *("--workloads", ",".join(SYSTEMS)),
        *("--systems", ",".join({name for names in SYSTEMS.values() for name in names})),
        *("--out", str(out), "--work-dir", str(work)),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False
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
        for key in ("elements", "bytes", "seconds", "elements_per_s", "bytes_per_s"):
            assert run[key] > 0, (key, run)
        assert run["peak_rss_bytes"] >= run["base_rss_bytes"] > 0
        assert run["first_batch_s"] <= run["seconds"]
    remote = [run for run in runs if run["system"] in REMOTE]
    for run in remote:  # the bound is base + (prefetch + 2) batches
        extra_batches = run["extra"]["prefetch"] + 2
        expected = run["base_rss_bytes"] + extra_batches * run["batch_bytes"]
        assert run["memory_bound_bytes"] == expected
    assert all(run["memory_bound_bytes"] is None for run in runs if run not in remote)
    # Only loadax's own environment was used: no peer virtualenv was made.
    assert sorted(path.name for path in work.iterdir()) == ["data"]

    table = out.read_text()
    assert "## Targets" in table
    assert "| W1: loadax ≥ 3x the best peer | not measured | — |" in table
    assert "| R1: remote ≥ 0.6x local mode | " in table
    assert "| R1: remote ≥ 0.6x local mode | not measured" not in table
    for names in SYSTEMS.values():
        for name in names:
            assert f"| **{name}** | " in table
    assert "## W3" not in table
