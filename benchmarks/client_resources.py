"""The threads and file descriptors of one client process by fleet size: a `RemoteDataLoader`
over N real workers (`tests/many_workers.py`, all in one other process) reads batches, and its
process counts its own threads (/proc/self/task) and descriptors (/proc/self/fd) while the loader
is open.

    python benchmarks/client_resources.py [--transports grpc,zmq] [--workers 16,32,64]
                                          [--batches 256] [--json PATH]
    python benchmarks/client_resources.py client TARGET...   # one client; prints its JSON line

A client's line: `threads` and `fds` of the whole process with the loader open, the same
`*_before` it was built (JAX's backend up, as in a trainer), `members` (targets that answered a
batch request), `batches_per_s` (of tiny batches from idle workers: what the client's own
machinery takes per batch), `thread_names` (how many Python threads of each name, digits
dropped) and `task_names` (the same of all its threads, by their system names: gRPC's own too).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax

from loadax.client import RemoteDataLoader

ROOT = Path(__file__).resolve().parents[1]
MANY_WORKERS = ROOT / "tests" / "many_workers.py"
READY_TIMEOUT_S = 120.0
BATCHES = 256
"""Batches a client reads: enough for every member of 64 to answer a few requests."""


def client(targets: Sequence[str], batches: int = BATCHES) -> dict[str, Any]:
    """Read `batches` batches of `numbers` from `targets`; this process's resources meanwhile."""
    # A trainer's JAX backend is up before its loader: XLA's threads (by the machine's cores:
    # 12 on 2 cores) are not the loader's.
    jax.devices()
    before = _threads(), _fds()
    builder = RemoteDataLoader(list(targets), pipeline="numbers").batch_size(1).num_epochs(None)
    # The workers stand in for a fleet on other hosts: what a connection costs. Through shared
    # memory each batch in flight would hold a memory file (2 descriptors) on top.
    builder = builder.shared_memory(False)
    with builder.build() as loader:
        iterator = iter(loader)
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        seconds = time.perf_counter() - start
        threads, fds = _threads(), _fds()
        names = collections.Counter(re.sub(r"\d+", "", t.name) for t in threading.enumerate())
        tasks = collections.Counter(re.sub(r"\d+", "", name) for name in _task_names())
        stats = loader.stats()
    return {
        "targets": len(targets),
        "members": sum(1 for worker in stats.workers.values() if worker.requests),
        "threads": threads,
        "fds": fds,
        "threads_before": before[0],
        "fds_before": before[1],
        "batches_per_s": batches / seconds,
        "thread_names": dict(names.most_common()),
        "task_names": dict(tasks.most_common()),
    }


@contextlib.contextmanager
def many_workers(transport: str, count: int) -> Iterator[list[str]]:
    """`count` workers over `transport` in another process, stopped at the end; their targets."""
    command = [sys.executable, str(MANY_WORKERS), "--transport", transport, "--count", str(count)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    # Its stdin ends with this process, and so does it, however this process ends.
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            stdout = process.stdout
            assert stdout is not None
            ready: list[str] = []
            reader = threading.Thread(target=lambda: ready.append(stdout.readline()))
            reader.start()
            reader.join(READY_TIMEOUT_S)
            if not ready or not ready[0].startswith('{"event": "ready"'):
                raise RuntimeError(
                    f"{count} workers were not ready in {READY_TIMEOUT_S} s "
                    f"(exit status {process.poll()})"
                )
            yield list(json.loads(ready[0])["targets"])
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def measure(transport: str, count: int, batches: int = BATCHES) -> dict[str, Any]:
    """A client process's line (see `client`) against `count` workers over `transport`."""
    with many_workers(transport, count) as targets:
        result = subprocess.run(
            [sys.executable, __file__, "client", "--batches", str(batches), *targets],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    if result.returncode:
        raise RuntimeError(f"the client failed ({result.returncode}):\n{result.stderr}")
    line: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return {"transport": transport, **line}


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _task_names() -> list[str]:
    """The system's names of this process's threads (gRPC's own among them)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["client"]:
        parser = argparse.ArgumentParser(prog="client_resources.py client")
        parser.add_argument("--batches", type=int, default=BATCHES)
        parser.add_argument("targets", nargs="+")
        options = parser.parse_args(args[1:])
        print(json.dumps(client(options.targets, options.batches)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", default="grpc,zmq")
    parser.add_argument("--workers", default="16,32,64")
    parser.add_argument("--batches", type=int, default=BATCHES, help="batches a client reads")
    parser.add_argument("--json", type=Path, help="write every client's line here")
    options = parser.parse_args(args)
    lines = []
    print("| transport | workers | members | threads (loader's) | fds (loader's) | batches/s |")
    print("|---|---|---|---|---|---|")
    for transport in options.transports.split(","):
        for count in (int(workers) for workers in options.workers.split(",")):
            line = measure(transport, count, options.batches)
            lines.append(line)
            threads = f"{line['threads']} ({line['threads'] - line['threads_before']})"
            fds = f"{line['fds']} ({line['fds'] - line['fds_before']})"
            print(
                f"| {transport} | {count} | {line['members']} | {threads} | {fds} "
                f"| {line['batches_per_s']:.0f} |",
                flush=True,
            )
    if options.json is not None:
        options.json.write_text(json.dumps(lines, indent=1) + "\n")


if __name__ == "__main__":
    main()
