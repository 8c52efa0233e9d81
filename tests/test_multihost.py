"""Real multi-process JAX on CPU: every topology assembles the same global batches."""

from __future__ import annotations

import pathlib

import pytest
from processes import run_jax_processes

CHECK = pathlib.Path(__file__).parent / "multihost_check.py"


def run_topology(processes: int, devices: int, *extra: str) -> str:
    """Run the check in `processes` JAX processes of `devices` CPU devices; process 0's output."""
    return run_jax_processes(CHECK, processes, devices, *extra)[0]


def digest(output: str, prefix: str = "digest ") -> str:
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture(scope="module")
def saved_state(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("multihost") / "state.json"


@pytest.fixture(scope="module")
def single_process_output(saved_state: pathlib.Path) -> str:
    return run_topology(1, 8, f"--save-state={saved_state}")


def test_one_process_with_eight_devices_matches_the_reference(single_process_output: str) -> None:
    for scenario in ("ddp", "fsdp", "interleaved", "model_across_processes", "tuple_axes"):
        assert f"ok {scenario}: 6 steps" in single_process_output
    assert "ok device_prefetch" in single_process_output
    assert "ok stream: 6 steps" in single_process_output


@pytest.mark.parametrize(("processes", "devices"), [(2, 4), (4, 2)])
def test_every_topology_assembles_the_same_global_batches(
    processes: int, devices: int, single_process_output: str, saved_state: pathlib.Path
) -> None:
    output = run_topology(processes, devices, f"--restore-state={saved_state}")
    for scenario in ("ddp", "fsdp", "interleaved", "model_across_processes", "tuple_axes"):
        assert f"ok {scenario}: 6 steps" in output
    assert "ok restored 4 steps" in output
    assert digest(output) == digest(single_process_output)
    assert "ok stream restored 4 steps" in output
    assert digest(output, "stream digest ") == digest(single_process_output, "stream digest ")
