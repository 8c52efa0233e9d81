"""Real `loadax-worker` processes for tests: started from a config, always killed at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from processes import free_port

TESTS = Path(__file__).resolve().parent
PIPELINES = """
[pipelines.numbers]
factory = "pipelines:numbers"

[pipelines.images]
factory = "pipelines:images"
"""
READY_TIMEOUT_S = 60.0


class _Output:
    """What a process printed, as it arrives; waiters block on a condition, never spin."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._chunks: list[str] = []
        self._open_streams = 2
        self.ready: dict[str, Any] | None = None

    def read(self, stream: IO[str], is_stdout: bool) -> None:
        for line in stream:
            with self._condition:
                self._chunks.append(line)
                if is_stdout and self.ready is None and line.startswith('{"event": "ready"'):
                    self.ready = json.loads(line)
                self._condition.notify_all()
        with self._condition:
            self._open_streams -= 1
            self._condition.notify_all()

    def text(self) -> str:
        with self._condition:
            return "".join(self._chunks)

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether `predicate()` came true before `timeout` or the end of the output."""
        with self._condition:
            self._condition.wait_for(lambda: predicate() or not self._open_streams, timeout)
            return predicate()


@dataclasses.dataclass
class WorkerProcess:
    """A running worker: its addresses as clients name them, and its process."""

    grpc: str | None  # "grpc://127.0.0.1:PORT"
    zmq: str | None  # "zmq://127.0.0.1:PORT"
    metrics: str | None  # "127.0.0.1:PORT" of the Prometheus exporter
    pipelines: list[str]
    process: subprocess.Popen[str]
    _output: _Output

    @property
    def grpc_address(self) -> str:
        """The gRPC "host:port", as `grpc.insecure_channel` takes it."""
        assert self.grpc is not None, "this worker does not serve gRPC"
        return self.grpc.removeprefix("grpc://")

    def address(self, transport: str) -> str:
        """Its address over `transport` ("grpc" or "zmq"), as a client names it."""
        chosen = self.grpc if transport == "grpc" else self.zmq
        assert chosen is not None, f"this worker does not serve {transport}"
        return chosen

    def output(self) -> str:
        """Everything the process printed so far, on stdout and stderr."""
        return self._output.text()

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        """Block until the process has printed `text`."""
        if not self._output.wait(lambda: text in self._output.text(), timeout):
            raise AssertionError(f"the worker did not print {text!r}; it printed:\n{self.output()}")

    def terminate(self, timeout: float = 60.0) -> int:
        """Send SIGTERM and wait for the process to exit; its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@contextlib.contextmanager
def stopped(*workers: WorkerProcess) -> Iterator[None]:
    """The workers frozen with SIGSTOP (each hangs, holding its connections), then resumed."""
    for worker in workers:
        os.kill(worker.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for worker in workers:
            os.kill(worker.process.pid, signal.SIGCONT)


def write_config(
    directory: Path,
    pipelines: str = PIPELINES,
    *,
    grpc: bool = True,
    zmq: bool = False,
    threads: int = 2,
    max_in_flight_per_client: int = 16,
) -> Path:
    """A worker config listening on free ports of 127.0.0.1."""
    server = ["[server]"]
    if grpc:
        server.append('grpc = "127.0.0.1:0"')
    if zmq:
        server.append('zmq = "tcp://127.0.0.1:0"')
    server += [f"threads = {threads}", f"max_in_flight_per_client = {max_in_flight_per_client}"]
    path = directory / "worker.toml"
    path.write_text("\n".join(server) + "\n" + pipelines)
    return path


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker process: `tests/` importable, for `pipelines:...`, with the
    `extra` variables."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def worker_process(
    tmp_path: Path,
    pipelines: str = PIPELINES,
    *,
    grpc: bool = True,
    zmq: bool = False,
    threads: int = 2,
    max_in_flight_per_client: int = 16,
    args: Sequence[str] = (),
    config: Path | None = None,
    launcher: Sequence[str] = ("-m", "loadax.server.main"),
    env: Mapping[str, str] | None = None,
) -> Iterator[WorkerProcess]:
    """A worker serving `pipelines` (TOML [pipelines.*] tables), once it is ready; given a
    `config` file, the worker runs that instead. `launcher` is what the interpreter runs, with
    the worker's arguments after it (e.g. `("-m", "tampered_worker", "junk")`); `env` adds
    environment variables."""
    config = config or write_config(
        tmp_path,
        pipelines,
        grpc=grpc,
        zmq=zmq,
        threads=threads,
        max_in_flight_per_client=max_in_flight_per_client,
    )
    command = [sys.executable, *launcher, "--config", str(config), *args]
    output = _Output()
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env(env),
        cwd=tmp_path,
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        readers = [
            threading.Thread(target=output.read, args=(stream, is_stdout), daemon=True)
            for stream, is_stdout in ((process.stdout, True), (process.stderr, False))
        ]
        for reader in readers:
            reader.start()
        try:
            if not output.wait(lambda: output.ready is not None, READY_TIMEOUT_S):
                raise RuntimeError(
                    f"the worker was not ready within {READY_TIMEOUT_S} s (exit status "
                    f"{process.poll()}); it printed:\n{output.text()}"
                )
            ready = output.ready
            assert ready is not None
            yield WorkerProcess(
                grpc=None if ready["grpc"] is None else f"grpc://{ready['grpc']}",
                zmq=None if ready["zmq"] is None else ready["zmq"].replace("tcp://", "zmq://", 1),
                metrics=ready["metrics"],
                pipelines=list(ready["pipelines"]),
                process=process,
                _output=output,
            )
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            for reader in readers:
                reader.join(timeout=10)


@contextlib.contextmanager
def worker_with_settings(
    tmp_path: Path,
    server: str,
    pipelines: str = PIPELINES,
    **options: Any,
) -> Iterator[WorkerProcess]:
    """`worker_process` with more `[server]` settings: `server` (TOML keys, then sub-tables such
    as `[server.tls]`) is written right after the `[server]` table; paths in it are relative to
    `tmp_path`, where the config is."""
    with worker_process(tmp_path, server.strip() + "\n" + pipelines, **options) as worker:
        yield worker


@contextlib.contextmanager
def worker_processes(
    directory: Path, count: int, pipelines: str = PIPELINES, **options: Any
) -> Iterator[list[WorkerProcess]]:
    """`count` workers serving `pipelines`, each with its own config under `directory`."""
    with contextlib.ExitStack() as stack:
        running = []
        for index in range(count):
            home = directory / f"worker{index}"
            home.mkdir()
            running.append(stack.enter_context(worker_process(home, pipelines, **options)))
        yield running


class Pinned:
    """Workers on fixed loopback addresses, restarted there with other pipelines at will, each
    loading on `threads` threads."""

    def __init__(
        self, directory: Path, stack: contextlib.ExitStack, transport: str, threads: int = 2
    ):
        self._directory, self._stack, self._transport = directory, stack, transport
        self._threads = threads
        self._starts = itertools.count()
        self.targets: list[str] = []
        self.running: list[WorkerProcess] = []

    def start(self, pipelines_toml: str, host: str = "127.0.0.1", port: int | None = None) -> str:
        """A worker serving `pipelines_toml` at `host`:`port` (a free one by default)."""
        self.targets.append(self.address(host, port))
        self.running.append(self._start(len(self.running), pipelines_toml))
        return self.targets[-1]

    def address(self, host: str = "127.0.0.1", port: int | None = None) -> str:
        """An address of this transport at `host`:`port` (a free one by default)."""
        return f"{self._transport}://{host}:{port or free_port()}"

    def start_at(self, target: str, pipelines_toml: str) -> None:
        """A worker serving `pipelines_toml` at `target`, an `address()` not started yet."""
        self.targets.append(target)
        self.running.append(self._start(len(self.running), pipelines_toml))

    def restart(self, index: int, pipelines_toml: str) -> None:
        """Kill worker `index` (-9) and start another on its port serving `pipelines_toml`."""
        self.running[index].process.kill()
        self.running[index].process.wait()
        self.running[index] = self._start(index, pipelines_toml)

    def _start(self, index: int, pipelines_toml: str) -> WorkerProcess:
        home = self._directory / f"worker{index}-{next(self._starts)}"
        home.mkdir()
        where = self.targets[index].split("://", 1)[1]
        pin = ["--grpc", where] if self._transport == "grpc" else ["--zmq", f"tcp://{where}"]
        return self._stack.enter_context(
            worker_process(
                home,
                pipelines_toml,
                zmq=self._transport == "zmq",
                threads=self._threads,
                args=pin,
            )
        )


@contextlib.contextmanager
def pinned(tmp_path: Path, transport: str, threads: int = 2) -> Iterator[Pinned]:
    with contextlib.ExitStack() as stack:
        yield Pinned(tmp_path, stack, transport, threads)
