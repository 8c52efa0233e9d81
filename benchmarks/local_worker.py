"""A `loadax-worker` in a process of its own, on loopback, for the benchmarks that need one."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Served:
    """A running worker: its process id and its address over the transport asked for."""

    pid: int
    address: str


@contextmanager
def worker(config: Path, transport: str, *options: str) -> Iterator[Served]:
    """The worker of `config` (its factories importable from benchmarks/), started with
    `options`, until the block ends; `transport` ("zmq" or "grpc") picks the address."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "loadax.server.main", "--config", str(config), *options]
    with subprocess.Popen(
        [*command, "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            assert process.stdout is not None
            ready = json.loads(process.stdout.readline())
            address = (
                ready["zmq"].replace("tcp://", "zmq://", 1)
                if transport == "zmq"
                else f"grpc://{ready['grpc']}"
            )
            yield Served(process.pid, address)
        finally:
            process.terminate()
            process.wait(timeout=60)
