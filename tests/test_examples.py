"""The examples and the P1 benchmark run as scripts, and print what they claim to."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"
TRAIN_DATA_PARALLEL = ROOT / "examples" / "train_data_parallel.py"
TRAIN_RESUME = ROOT / "examples" / "train_resume.py"
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


@pytest.mark.parametrize(("workers", "transport"), [(1, "grpc"), (2, "zmq")])
def test_demo_serves_the_local_batches_remotely_and_resumes_identically(
    workers: int, transport: str
) -> None:
    result = run_script(
        DEMO,
        *("--records", "100", "--batch-size", "16", "--epochs", "2"),
        *("--workers", str(workers), "--transport", transport),
    )

    assert result.returncode == 0, result.stderr
    ready = line_starting(result.stdout, "worker ready:")
    assert ready.startswith(f"worker ready: serving ['images'] at {transport}://127.0.0.1:")
    assert line_starting(result.stdout, "batches:") == "batches: identical in local and remote mode"
    assert "resume check: identical" in result.stdout
    assert line_starting(result.stdout, "batch shapes:") == (
        "batch shapes: image=(16, 56, 56, 3) float32, label=(16,) int64"
    )
    assert line_starting(result.stdout, "worker stopped") == "worker stopped (exit status 0)"


def test_demo_counts_every_record_of_every_epoch() -> None:
    result = run_script(DEMO, "--records", "100", "--batch-size", "16", "--epochs", "2")

    assert result.returncode == 0, result.stderr
    # 100 records in batches of 16 end each epoch with a short batch of 4: 7 batches an epoch.
    assert line_starting(result.stdout, "local:").endswith("(200 records in 14 batches)")
    assert line_starting(result.stdout, "remote grpc:").endswith("(200 records in 14 batches)")


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


def reported_number(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def child_pids(output: str) -> list[int]:
    return [
        int(pid) for pid in re.findall(r"\[launcher\] started process \d+ \(pid (\d+)\)", output)
    ]


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_data_parallel_training_over_two_processes_learns_and_resumes_identically() -> None:
    result = run_script(TRAIN_DATA_PARALLEL, "--processes", "2", "--devices-per-process", "2")

    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout
    assert "[0] 2 processes, 4 devices, global batch 32, 48 steps" in output
    step_losses = [
        float(loss) for loss in re.findall(r"^\[0\] step \d+: loss (\S+)$", output, re.M)
    ]
    assert len(step_losses) == 6, output  # steps 0, 8, ..., 40
    final_loss = reported_number(line_starting(output, "[0] final loss:"))
    assert final_loss < step_losses[0], output
    assert reported_number(line_starting(output, "[0] weight distance:")) < 0.1, output
    assert "[0] resume check: identical" in output
    # Only process 0 reports; the others' lines would start with their own id.
    assert not re.search(r"^\[1\] (step|final|weight|resume)", output, re.M), output
    assert line_starting(output, "[launcher] all").startswith("[launcher] all 2 processes finished")


def test_a_failed_process_stops_every_process_and_fails_the_launcher() -> None:
    # Process 1 raises at step 3 while process 0 waits for it in the gradient all-reduce.
    result = run_script(TRAIN_DATA_PARALLEL, "--crash-at-step", "3")

    assert result.returncode != 0
    output = result.stdout
    assert "[1] RuntimeError: injected failure at step 3" in output
    assert "[launcher] process 1 exited with code 1; stopped every process" in output
    assert "resume check" not in output
    pids = child_pids(output)
    assert len(pids) == 2, output
    assert not any(is_running(pid) for pid in pids)


def test_a_batch_that_does_not_split_over_the_devices_fails_the_launcher() -> None:
    # 2 processes of 3 devices: 6 data shards cannot split the global batch of 32.
    result = run_script(TRAIN_DATA_PARALLEL, "--devices-per-process", "3")

    assert result.returncode != 0
    assert "not divisible by the 6 shards" in result.stdout
    assert "; stopped every process" in result.stdout
    assert "resume check" not in result.stdout


def test_the_launcher_stops_every_process_when_its_time_is_up() -> None:
    result = run_script(TRAIN_DATA_PARALLEL, "--timeout", "0")

    assert result.returncode != 0
    assert "[launcher] timed out after 0 s; stopped every process" in result.stdout
    pids = child_pids(result.stdout)
    assert len(pids) == 2, result.stdout
    assert not any(is_running(pid) for pid in pids)


def test_training_killed_with_sigkill_resumes_on_the_uninterrupted_loss_curve() -> None:
    command = [sys.executable, str(TRAIN_RESUME), "--steps", "10", "--checkpoint-every", "3"]
    # Its own session, so that on a timeout its workers and trainers are killed with it.
    with subprocess.Popen(
        [*command, "--kill-after", "7"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as example:
        try:
            output, errors = example.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(example.pid, signal.SIGKILL)
            raise

    assert example.returncode == 0, output + errors
    workers = line_starting(output, "workers: ")
    assert re.fullmatch(
        r"workers: 2 loadax-worker processes serve 'regression' at "
        r"grpc://127\.0\.0\.1:\d+, grpc://127\.0\.0\.1:\d+",
        workers,
    ), workers
    assert line_starting(output, "reference run:").endswith("checkpoints at steps 3, 6, 9")
    assert line_starting(output, "killed run:") == (
        "killed run: checkpoints at steps 3, 6, step 6 committed; "
        "SIGKILLed both trainers after step 7 (exit status -9, -9)"
    )
    assert line_starting(output, "resumed run:").startswith(
        "resumed run: restored model, optimizer and loader at step 6, trained steps 7-10 in "
    )
    rows = [line.split() for line in output.splitlines() if re.match(r"^ +\d+  ", line)]
    assert [int(row[0]) for row in rows] == list(range(1, 11)), output
    for step, reference, *others in rows:
        # Steps 1-6: reference, killed; step 7: lost to the kill, recomputed; 8-10: resumed.
        assert others == [reference] * (2 if step == "7" else 1), output
    losses = [float(row[1]) for row in rows]
    assert losses[-1] < losses[0], output  # it learns
    assert line_starting(output, "losses before the kill match:").endswith(": yes")
    assert line_starting(output, "resumed loss curve matches:").endswith(": yes")
    assert line_starting(output, "workers stopped") == "workers stopped (exit status 0, 0)"
