"""Servers the remote systems talk to, all on loopback: `loadax-worker` processes, and tf.data
service dispatchers with their workers. The driver starts one when a system first needs it
(untimed) and stops every one at the end; each prints a JSON "ready" line with its address.

R2's fleet is one pool of workers that grows to the largest fleet asked for so far (a fleet of N
is its first N workers), beside a pool of slow ones (`fleet.SLOWDOWN_ENV` set).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fleet
from catalog import LOADAX_WORKERS, TF_SERVICE_1, TF_SERVICE_2
from workloads import REMOTE_PIPELINES, T1_BATCH_BYTES, Workload

BENCHMARKS = Path(__file__).resolve().parent
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
WORKER_THREADS = 2
LOADAX_WORKER_COUNT = 2
NO_REPLY_CACHE = "share_cache_mb = 0"
"""The workers keep no replies: each system and round runs the same plan on the same workers,
and R1, T1 and R2 measure making and moving batches, not serving them again (requests in flight
for the same batch, hedges, are still made once)."""


def child_env() -> dict[str, str]:
    """The environment of every process the suite starts: the benchmarks importable (worker
    factories), CPU-only JAX, quiet TF."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(BENCHMARKS), os.environ.get("PYTHONPATH")])
        ),
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


class Services:
    """The servers started so far, by name; `options(name)` is what a client is told of one."""

    def __init__(
        self, directory: Path, workloads: Mapping[str, Workload], peers_python: Path | None
    ) -> None:
        self._directory, self._workloads, self._peers_python = directory, workloads, peers_python
        self._processes: list[subprocess.Popen[bytes]] = []
        self._options: dict[str, dict[str, str]] = {}
        self._failures: dict[str, str] = {}
        # The "ready" events of R2's fleet workers: healthy ones, and slow ones.
        self._fleet: list[dict[str, Any]] = []
        self._slow: list[dict[str, Any]] = []

    def options(self, name: str) -> dict[str, str]:
        """The addresses of service `name`, started now unless it is already (or failed to)."""
        if name in self._failures:
            raise RuntimeError(self._failures[name])
        if name not in self._options:
            try:
                self._options[name] = self._start(name)
            except (RuntimeError, OSError) as error:
                self._failures[name] = str(error)
                raise
        return self._options[name]

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.send_signal(signal.SIGCONT)  # a stopped one handles SIGTERM too
        for process in self._processes:
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        self._options.clear()
        self._failures.clear()
        self._fleet.clear()
        self._slow.clear()

    def _start(self, name: str) -> dict[str, str]:
        if name == LOADAX_WORKERS:
            config = self._loadax_config()
            command = [sys.executable, "-m", "loadax.server.main", "--config", str(config)]
            events = self._start_all(
                [(command, f"loadax-worker-{index}") for index in range(LOADAX_WORKER_COUNT)]
            )
            return {
                "grpc": ",".join(f"grpc://{event['grpc']}" for event in events),
                "zmq": ",".join(event["zmq"].replace("tcp://", "zmq://", 1) for event in events),
            }
        if name in fleet.SERVICES:
            return self._fleet_options(*fleet.SERVICES[name])
        if name in (TF_SERVICE_1, TF_SERVICE_2):
            if self._peers_python is None:
                raise RuntimeError(f"{name} needs the peers' environment")
            server = [str(self._peers_python), str(BENCHMARKS / "tfservice_server.py")]
            workers = 1 if name == TF_SERVICE_1 else 2
            label = f"tf-service-{workers}"
            (dispatcher,) = self._start_all([([*server, "dispatcher"], f"{label}-dispatcher")])
            address = dispatcher["address"]
            self._start_all(
                [([*server, "worker", address], f"{label}-worker-{i}") for i in range(workers)]
            )
            return {"dispatcher": address}
        raise ValueError(f"unknown service {name!r}")

    def _loadax_config(self) -> Path:
        """One config serving W2 (R1's data) and the batches of each T1 workload, on free
        loopback ports."""
        r1 = self._workloads.get("R1")
        pipelines = []
        if r1 is not None:
            pipelines.append(_pipeline("w2", f"path = {json.dumps(str(r1.data_file()))}"))
        for name, size in T1_BATCH_BYTES.items():
            if name in self._workloads:
                args = f"batches = {self._workloads[name].records}, batch_bytes = {size}"
                pipelines.append(_pipeline(REMOTE_PIPELINES[name], args, "t1"))
        config = self._directory / "worker.toml"
        config.write_text(
            "[server]\n"
            'grpc = "127.0.0.1:0"\n'
            'zmq = "tcp://127.0.0.1:0"\n'
            f"threads = {WORKER_THREADS}\n"
            f"{NO_REPLY_CACHE}\n\n" + "\n\n".join(pipelines) + "\n"
        )
        return config

    def _fleet_options(self, healthy: int, slow: int) -> dict[str, str]:
        """The first `healthy` fleet workers and `slow` slow ones (started now if need be):
        their addresses, and their process ids (`pids`) for the runs that signal them."""
        config = self._directory / "fleet.toml"
        if not config.is_file():
            config.write_text(self._fleet_config())
        command = [sys.executable, "-m", "loadax.server.main", "--config", str(config)]
        slowdown = {fleet.SLOWDOWN_ENV: str(fleet.SLOWDOWN)}
        for pool, wanted, prefix, env in (
            (self._fleet, healthy, "loadax-fleet", {}),
            (self._slow, slow, "loadax-fleet-slow", slowdown),
        ):
            missing = range(len(pool), wanted)
            pool += self._start_all([(command, f"{prefix}-{index}") for index in missing], env)
        chosen = self._fleet[:healthy] + self._slow[:slow]
        return {
            "grpc": ",".join(f"grpc://{event['grpc']}" for event in chosen),
            "zmq": ",".join(event["zmq"].replace("tcp://", "zmq://", 1) for event in chosen),
            "pids": ",".join(str(event["pid"]) for event in chosen),
        }

    def _fleet_config(self) -> str:
        """R2's pipelines, one per per-record cost, on free loopback ports."""
        spec = self._workloads.get("R2")
        if spec is None:
            raise RuntimeError("R2's fleet needs the R2 workload")
        pipelines = [
            _pipeline(
                fleet.pipeline_name(cost), f"records = {spec.records}, cost_ms = {cost}", "r2"
            )
            for cost in fleet.COSTS_MS
        ]
        return (
            "[server]\n"
            'grpc = "127.0.0.1:0"\n'
            'zmq = "tcp://127.0.0.1:0"\n'
            f"threads = {fleet.THREADS}\n"
            f"{NO_REPLY_CACHE}\n\n" + "\n\n".join(pipelines) + "\n"
        )

    def _launch(
        self, command: list[str], label: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = (self._directory / f"{label}.log").open("wb")
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**child_env(), **(env or {})},
            cwd=self._directory,
        )
        log.close()
        self._processes.append(process)
        return process

    def _log(self, label: str) -> str:
        """The last line `label` logged."""
        lines = (self._directory / f"{label}.log").read_text(errors="replace").splitlines()
        return lines[-1] if lines else "it logged nothing"

    def _start_all(
        self, commands: list[tuple[list[str], str]], env: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Start every (command, log name) at once, with `env` added to the environment; their
        "ready" events with their process ids ("pid"), once all are ready."""
        processes = [(self._launch(command, label, env), label) for command, label in commands]
        return [{**self._ready(process, label), "pid": process.pid} for process, label in processes]

    def _ready(self, process: subprocess.Popen[bytes], label: str) -> dict[str, Any]:
        """The process's "ready" event: the first JSON line on its stdout that has one."""
        if process.stdout is None:
            raise RuntimeError("started without a stdout pipe")
        deadline = time.monotonic() + READY_TIMEOUT_S
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            buffered = b""
            while time.monotonic() < deadline:
                if not selector.select(deadline - time.monotonic()):
                    break
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffered += chunk
                for line in buffered.split(b"\n")[:-1]:
                    with contextlib.suppress(ValueError):
                        event = json.loads(line)
                        if isinstance(event, dict) and event.get("event") == "ready":
                            return event
        raise RuntimeError(
            f"{label} was not ready within {READY_TIMEOUT_S} s (exit status {process.poll()}): "
            f"{self._log(label)}"
        )


def _pipeline(name: str, args: str, factory: str | None = None) -> str:
    """A worker config's table for pipeline `name` made by `bench_pipelines:FACTORY` (default:
    `name`), called with `args` (TOML)."""
    factory = f"bench_pipelines:{factory or name}"
    return f'[pipelines.{name}]\nfactory = "{factory}"\nargs = {{ {args} }}'
