"""The demo and the P1 benchmark run as scripts, and print what they claim to."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"
PLAN_BENCH = ROOT / "benchmarks" / "plan_bench.py"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def line_starting(output: str, prefix: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting {prefix!r} in:\n{output}"
    return lines[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_demo_resumes_identically_and_prints_the_batch_shape_of_its_flags(workers: int) -> None:
    result = run_script(
        DEMO, "--records", "100", "--batch-size", "16", "--workers", str(workers), "--epochs", "2"
    )

    assert result.returncode == 0, result.stderr
    assert "resume check: identical" in result.stdout
    assert line_starting(result.stdout, "batch shapes:") == (
        "batch shapes: image=(16, 56, 56, 3) float32, label=(16,) int64"
    )
    # 100 records in batches of 16 end each epoch with a short batch of 4.
    assert line_starting(result.stdout, "last batch:").startswith("last batch: 4 records")


def test_demo_counts_every_record_of_every_epoch() -> None:
    result = run_script(DEMO, "--records", "100", "--batch-size", "16", "--epochs", "2")

    assert result.returncode == 0, result.stderr
    throughput = line_starting(result.stdout, "throughput:")
    assert "(200 records in 14 batches," in throughput


def test_demo_prints_a_json_state_at_the_checkpointed_step() -> None:
    result = run_script(DEMO, "--records", "96", "--batch-size", "32")

    assert result.returncode == 0, result.stderr
    match = re.fullmatch(
        r"state after (\d+) batches: (\{.*\})", line_starting(result.stdout, "state after")
    )
    assert match is not None
    state = json.loads(match.group(2))
    assert state["step"] == int(match.group(1)) == 2  # 3 batches, checkpointed before the last
    assert state["plan"]["batch_size"] == 32
    assert state["plan"]["num_records"] == 96


def test_demo_rejects_a_zero_batch_size() -> None:
    result = run_script(DEMO, "--batch-size", "0")

    assert result.returncode != 0
    assert "--batch-size" in result.stderr


def test_plan_bench_writes_positive_throughput_and_batch_bound_memory(tmp_path: Path) -> None:
    output = tmp_path / "p1.json"
    result = run_script(
        PLAN_BENCH,
        *("--repeats", "1", "--batch-size", "4096", "--small-batch-size", "64"),
        *("--json", str(output)),
    )

    assert result.returncode == 0, result.stderr
    assert "P1 planner" in result.stdout
    numbers = json.loads(output.read_text())
    assert numbers["num_records"] == 10**10
    assert [speed["batch_size"] for speed in numbers["speed"]] == [4096, 64]
    for speed in numbers["speed"]:
        assert speed["median_indices_per_s"] > 0
        assert len(speed["runs_indices_per_s"]) == 1
        assert all(run > 0 for run in speed["runs_indices_per_s"])
    for batch_size in (4096, 64):
        peaks = {
            memory["num_records"]: memory["peak_bytes"]
            for memory in numbers["memory"]
            if memory["batch_size"] == batch_size
        }
        assert set(peaks) == {10**7, 10**10, 10**12}
        assert all(peak > 0 for peak in peaks.values())
        # O(batch) memory: a 100,000 times larger plan needs about the same.
        assert peaks[10**12] < 2 * peaks[10**7]
