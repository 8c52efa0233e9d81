"""Real multi-process JAX on CPU: every topology assembles the same global batches."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

CHECK = pathlib.Path(__file__).parent / "multihost_check.py"
TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_topology(processes: int, devices: int, *extra: str) -> str:
    """Run the check in `processes` JAX processes of `devices` CPU devices; process 0's output."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(CHECK),
                f"--process-id={index}",
                f"--num-processes={processes}",
                f"--coordinator={coordinator}",
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(processes)
    ]
    outputs = []
    try:
        for child in children:
            outputs.append(child.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for child in children:  # a failed or hung process must not outlive the test
            if child.poll() is None:
                child.kill()
                child.communicate()
    for index, (child, output) in enumerate(zip(children, outputs, strict=True)):
        assert child.returncode == 0, f"process {index} of {processes} failed:\n{output}"
    return outputs[0]


def digest(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("digest ")]
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


@pytest.mark.parametrize(("processes", "devices"), [(2, 4), (4, 2)])
def test_every_topology_assembles_the_same_global_batches(
    processes: int, devices: int, single_process_output: str, saved_state: pathlib.Path
) -> None:
    output = run_topology(processes, devices, f"--restore-state={saved_state}")
    for scenario in ("ddp", "fsdp", "interleaved", "model_across_processes", "tuple_axes"):
        assert f"ok {scenario}: 6 steps" in output
    assert "ok restored 4 steps" in output
    assert digest(output) == digest(single_process_output)
