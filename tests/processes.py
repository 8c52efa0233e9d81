"""Real processes for tests: free loopback ports, and multi-process JAX jobs on localhost."""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_jax_processes(script: Path, processes: int, devices: int, *extra: str) -> list[str]:
    """Run `script` in `processes` real JAX processes of `devices` CPU devices; each one's output.

    The script gets --process-id, --num-processes and --coordinator. A failure in one process
    fails the call with every process's output, and no process outlives it.
    """
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
                str(script),
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
    outputs: dict[int, str] = {}

    def finish(index: int) -> None:
        outputs[index] = children[index].communicate()[0]
        if children[index].returncode != 0:
            raise ChildProcessError(f"process {index} failed")

    with concurrent.futures.ThreadPoolExecutor(processes) as pool:
        finishing = [pool.submit(finish, index) for index in range(processes)]
        try:
            # Once one process fails, the others wait at a barrier for it: stop them at once.
            concurrent.futures.wait(
                finishing, TIMEOUT_S, return_when=concurrent.futures.FIRST_EXCEPTION
            )
        finally:
            for child in children:  # a failed or hung process must not outlive the test
                if child.poll() is None:
                    child.kill()
    report = "\n".join(
        f"process {index} of {processes} exited with {child.returncode}:\n{outputs[index]}"
        for index, child in enumerate(children)
    )
    assert all(child.returncode == 0 for child in children), report
    return [outputs[index] for index in range(processes)]
