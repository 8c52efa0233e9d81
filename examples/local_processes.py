"""Local processes for the examples: loadax workers on loopback, and multi-process JAX jobs.

A job's processes are all stopped as soon as one fails, and none outlives its launcher.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, NoReturn

EXAMPLES = Path(__file__).resolve().parent
READY_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
PRINT_LOCK = threading.Lock()

Command = Callable[[int, str], list[str]]
"""(process id, coordinator "host:port") -> the command line of that process."""
LineHandler = Callable[[int, str], None]
"""Gets (process id, line) for every line a process prints, on stdout or stderr."""


def say(line: str) -> None:
    """Print one whole line, even while other threads print theirs."""
    with PRINT_LOCK:
        print(line, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_worker(
    directory: Path,
    pipeline: str,
    factory: str,
    factory_args: Mapping[str, int],
    *,
    threads: int = 2,
    log_level: str = "INFO",
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A `loadax-worker` serving `factory(**factory_args)` (a function of a module in examples/)
    as `pipeline` over gRPC and ZeroMQ on free loopback ports, and its ready event (its addresses).
    """
    config = directory / "worker.toml"
    arguments = ", ".join(f"{name} = {value}" for name, value in factory_args.items())
    config.write_text(
        '[server]\ngrpc = "127.0.0.1:0"\nzmq = "tcp://127.0.0.1:0"\n'
        f"threads = {threads}\n\n[pipelines.{pipeline}]\n"
        f'factory = "{factory}"\nargs = {{ {arguments} }}\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "loadax.server.main", "--config", str(config)]
    worker = subprocess.Popen(
        [*command, "--log-level", log_level], stdout=subprocess.PIPE, text=True, env=env
    )
    if worker.stdout is None:  # always a pipe: see Popen above
        raise RuntimeError("the worker has no output pipe")
    timer = threading.Timer(READY_TIMEOUT_S, worker.kill)  # a silent worker must not hang us
    timer.start()
    try:
        for line in worker.stdout:
            event = json.loads(line)
            if event.get("event") == "ready":
                return worker, event
    finally:
        timer.cancel()
    worker.kill()
    raise RuntimeError(f"the worker did not start (exit status {worker.wait()})")


def stop_worker(worker: subprocess.Popen[str]) -> int:
    """SIGTERM: the worker drains the requests in flight, then exits (SIGKILL if it is still
    running after `STOP_TIMEOUT_S`). Its exit status."""
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


class JaxJob:
    """`processes` local JAX processes of `devices` CPU devices each, started together.

    Every line they print goes to `on_line`. Leaving the `with` block kills those still running.
    """

    def __init__(
        self, command: Command, processes: int, devices: int, on_line: LineHandler
    ) -> None:
        coordinator = f"127.0.0.1:{free_port()}"
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        }
        self._changed = threading.Condition()
        self._exits: list[tuple[int, int]] = []  # (process id, exit status), in exit order
        self.children: list[subprocess.Popen[str]] = []
        self._threads: list[threading.Thread] = []  # output readers and exit waiters
        try:
            for index in range(processes):
                child = subprocess.Popen(
                    command(index, coordinator),
                    env=env,
                    stdin=subprocess.PIPE,  # see run_child: the child exits when it closes
                    # Two pipes: C++ logging on stderr must not split the lines on stdout.
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                self.children.append(child)
                for stream in (child.stdout, child.stderr):
                    if stream is None:  # always a pipe: see Popen above
                        raise RuntimeError(f"process {index} has no output pipe")
                    self._start(self._read, index, stream, on_line)
                self._start(self._reap, index, child)
        except BaseException:
            self.kill()
            raise

    def wait(self, timeout: float, until: Callable[[], bool] = lambda: False) -> str | None:
        """Wait until every process has exited, one failed, or `until()` (checked after each
        line): None, or what went wrong."""

        def settled() -> bool:
            finished = len(self._exits) == len(self.children)
            return finished or self._failure() is not None or until()

        with self._changed:
            if not self._changed.wait_for(settled, timeout):
                return f"timed out after {timeout:g} s"
            return self._failure()

    def kill(self) -> list[int]:
        """SIGKILL every process still running; every process's exit status."""
        for child in self.children:
            if child.poll() is None:
                child.kill()
        return [child.wait() for child in self.children]

    def __enter__(self) -> JaxJob:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.kill()
        for thread in self._threads:
            thread.join()

    def _failure(self) -> str | None:
        failed = [(index, code) for index, code in self._exits if code != 0]
        return f"process {failed[0][0]} exited with code {failed[0][1]}" if failed else None

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _read(self, index: int, stream: IO[str], on_line: LineHandler) -> None:
        for line in stream:
            on_line(index, line.rstrip())
            with self._changed:
                self._changed.notify_all()

    def _reap(self, index: int, child: subprocess.Popen[str]) -> None:
        code = child.wait()
        with self._changed:
            self._exits.append((index, code))
            self._changed.notify_all()


def run_child(main: Callable[[], int]) -> NoReturn:
    """Run one process of a `JaxJob`: exit with `main()`'s status, or 1 if it raises."""
    # The launcher holds our stdin: when it goes away, even killed outright, so do we.
    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: jax.distributed's shutdown barrier would wait for failed peers.
    os._exit(code)


def _exit_when_stdin_closes() -> None:
    sys.stdin.buffer.read()
    os._exit(1)


def launch_or_train(
    args: argparse.Namespace,
    launch: Callable[[argparse.Namespace], int],
    train: Callable[[argparse.Namespace], int],
) -> int:
    """The command of an example: a JAX process trains (`--process-id` given), the launcher
    starts them and stops them all on SIGTERM."""
    if args.process_id is not None:
        return run_child(functools.partial(train, args))
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    return launch(args)


def stop_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """A SIGTERM handler that unwinds the launcher, whose `with` and `finally` blocks stop its
    processes."""
    raise SystemExit(128 + signum)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value
