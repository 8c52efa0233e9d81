"""Batches that take seconds to make, read through a default-configured gRPC proxy
(`tests/grpc_proxy.py`): the requests lost (calls the proxy saw fail or cancelled, and failures
the loader counted), the GOAWAYs the client received (gRPC core logs each one: "too_many_pings"),
and how late the first slow batch came (from the start) against the time it takes to make.

    python benchmarks/proxy_check.py [--seconds 6,10] [--batches 10] [--client-rev REV]
                                     [--json PATH]
    python benchmarks/proxy_check.py client TARGET --batches N   # one client; its JSON line

The worker (`proxy_pipelines:slow_after`) makes a fast batch, then `--batches` batches of
`--seconds` each (4 records, 2 read at once); the client reads them all with default settings.
`--client-rev` runs the client with the gRPC transport of that git revision (e.g. one from
before heartbeats, which pinged every second), the rest of the tree as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from loadax.client import RemoteDataLoader
from loadax.errors import WorkerError

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))  # the tests' proxy, worker processes and pipeline
grpc_proxy = importlib.import_module("grpc_proxy")
workers = importlib.import_module("workers")

TRANSPORT = "client/transports/grpc.py"
_OLD_TRANSPORT = f'''"""Loads {TRANSPORT} of a past revision in place of the current one."""
import importlib.abc, importlib.util, os, sys

import loadax.wire.limits as limits

# The constants it imports that are gone now, as they were.
limits.GRPC_KEEPALIVE_MS = limits.__dict__.get("GRPC_KEEPALIVE_MS", 1_000)
limits.GRPC_KEEPALIVE_TIMEOUT_MS = limits.__dict__.get("GRPC_KEEPALIVE_TIMEOUT_MS", 1_000)


class _Past(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "loadax.client.transports.grpc":
            past = os.path.join(os.path.dirname(__file__), "past_grpc.py")
            return importlib.util.spec_from_file_location(name, past)
        return None


sys.meta_path.insert(0, _Past())
'''


def client(target: str, batches: int) -> dict[str, Any]:
    """Read the fast batch and `batches` slow ones of `slow` from `target`, or as many as come
    before the loader gives up (`error`)."""
    started = time.monotonic()
    arrivals = []
    error = None
    builder = RemoteDataLoader([target], pipeline="slow").batch_size(4)
    with builder.build() as loader:
        try:
            for _ in loader:
                arrivals.append(time.monotonic() - started)
        except WorkerError as failed:
            error = str(failed)
        stats = loader.stats().workers[target]
    return {
        "batches": len(arrivals),
        "error": error,
        "failures": stats.failures,
        "last_error": stats.last_error,
        "first_slow_batch_s": arrivals[1] if len(arrivals) > 1 else None,
        "wall_s": time.monotonic() - started,
    }


@contextlib.contextmanager
def past_transport(revision: str | None) -> Iterator[list[str]]:
    """PYTHONPATH entries that make a client use the gRPC transport of `revision` (none: the
    current one)."""
    if revision is None:
        yield []
        return
    source = subprocess.run(
        ["git", "show", f"{revision}:{TRANSPORT}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "past_grpc.py").write_text(source)
        (Path(folder) / "sitecustomize.py").write_text(_OLD_TRANSPORT)
        yield [folder]


def measure(seconds: float, batches: int, revision: str | None) -> dict[str, Any]:
    """One client through a fresh proxy to a fresh worker: its line, with what the proxy saw."""
    config = f"""
[pipelines.slow]
factory = "proxy_pipelines:slow_after"
args = {{ records = {4 * (batches + 1)}, delay = {seconds / 2} }}
"""
    with (
        tempfile.TemporaryDirectory() as home,
        workers.worker_process(Path(home), config) as worker,
        grpc_proxy.start(worker.grpc_address) as (proxy, log),
        past_transport(revision) as path,
    ):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(TESTS), *sys.path])}
        command = [sys.executable, __file__, "client", f"grpc://{proxy}", "--batches", str(batches)]
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=60 + 3 * seconds * batches
        )
        proxied = log()
    if result.returncode:
        raise RuntimeError(f"the client failed ({result.returncode}):\n{result.stderr}")
    line: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return {
        "seconds": seconds,
        "client": revision or "current",
        "requests": batches,
        **line,
        "lost_at_proxy": proxied.count('"event": "call"'),
        "goaways": result.stderr.count("too_many_pings"),
        "first_slow_batch_late": None
        if line["first_slow_batch_s"] is None
        else round(line["first_slow_batch_s"] / seconds, 2),
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["client"]:
        parser = argparse.ArgumentParser(prog="proxy_check.py client")
        parser.add_argument("target")
        parser.add_argument("--batches", type=int, required=True)
        options = parser.parse_args(args[1:])
        print(json.dumps(client(options.target, options.batches)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", default="6,10", help="batch times, comma-separated")
    parser.add_argument("--batches", type=int, default=10, help="slow batches per run")
    parser.add_argument("--client-rev", help="the git revision of the client's gRPC transport")
    parser.add_argument("--json", type=Path, help="also write the lines here")
    options = parser.parse_args(args)
    lines = []
    for seconds in (float(each) for each in options.seconds.split(",")):
        line = measure(seconds, options.batches, options.client_rev)
        print(json.dumps(line), flush=True)
        lines.append(line)
    if options.json is not None:
        options.json.write_text(json.dumps(lines, indent=2) + "\n")


if __name__ == "__main__":
    main()
