"""R2's steady runs as from other hosts (no shared memory: replies over the sockets), or T1-like
pre-built batches of one size: steady-state records/s, and the client's and the workers' CPU per
batch, so that the cost of a small batch on each data path shows (`benchmarks/PROFILES.md`).

    python benchmarks/r2_sockets.py --workers 8 [--cost-ms 5] [--records 8192] [--step-ms 10]
        [--batch-bytes N] [--data-socket-from N] [--no-data-port] [--transport grpc|zmq]
        [--benchmarks DIR]

One JSON line. Workers are `loadax-worker` processes on loopback as R2's (8 threads, no reply
cache), serving R2's pipeline, or with `--batch-bytes` one pre-built batch of that many bytes per
record (batch size 1). `--step-ms` sleeps after each batch (R2's client-cost row). The loadax
under test is the one this interpreter imports; `--benchmarks` is the directory whose
`bench_pipelines` the workers import (another revision's, to compare with it: run from outside
the tree with that revision's package on PYTHONPATH). `--data-socket-from` sets the gRPC
transport's `data_socket_from_bytes`; `--no-data-port` turns the workers' gRPC data port off.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cost-ms", type=int, default=5)
    parser.add_argument("--records", type=int, default=8192)
    parser.add_argument("--step-ms", type=int, default=0)
    parser.add_argument("--batch-bytes", type=int, default=0)
    parser.add_argument("--data-socket-from", type=int, default=None)
    parser.add_argument("--no-data-port", action="store_true")
    parser.add_argument("--transport", choices=("grpc", "zmq"), default="grpc")
    parser.add_argument("--benchmarks", type=Path, default=BENCHMARKS)
    args = parser.parse_args()
    if args.data_socket_from is not None:
        from loadax.client import transports
        from loadax.client.transports.grpc import GrpcTransport

        transports.TRANSPORTS = {
            **transports.TRANSPORTS,
            "grpc": functools.partial(GrpcTransport, data_socket_from_bytes=args.data_socket_from),
        }
    with tempfile.TemporaryDirectory(prefix="loadax-r2-sockets-") as directory:
        config = Path(directory) / "worker.toml"
        config.write_text(_config(args))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(args.benchmarks), os.environ.get("PYTHONPATH")])
            ),
            "JAX_PLATFORMS": "cpu",
        }
        command = [sys.executable, "-m", "loadax.server.main", "--config", str(config)]
        workers = [
            subprocess.Popen(command, stdout=subprocess.PIPE, env=env, cwd=directory)
            for _ in range(args.workers)
        ]
        try:
            ready = [_ready(worker) for worker in workers]
            print(json.dumps(_run(args, ready, [worker.pid for worker in workers])), flush=True)
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait()


def _config(args: argparse.Namespace) -> str:
    if args.batch_bytes:
        factory, pipeline_args = "t1", f"batches = {args.records}, batch_bytes = {args.batch_bytes}"
    else:
        factory, pipeline_args = "r2", f"records = {args.records}, cost_ms = {args.cost_ms}"
    return (
        '[server]\ngrpc = "127.0.0.1:0"\nzmq = "tcp://127.0.0.1:0"\nthreads = 8\n'
        "share_cache_mb = 0\n"
        + ("grpc_data_port = false\n" if args.no_data_port else "")
        + f'\n[pipelines.bench]\nfactory = "bench_pipelines:{factory}"\n'
        f"args = {{ {pipeline_args} }}\n"
    )


def _ready(worker: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The worker's "ready" line."""
    assert worker.stdout is not None
    for line in worker.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "ready":
            return event
    raise RuntimeError(f"a worker exited before it was ready (status {worker.wait()})")


def _run(args: argparse.Namespace, ready: list[dict[str, Any]], pids: list[int]) -> dict[str, Any]:
    from loadax.client import RemoteDataLoader

    if args.transport == "grpc":
        targets = [f"grpc://{event['grpc']}" for event in ready]
    else:
        targets = [event["zmq"].replace("tcp://", "zmq://", 1) for event in ready]
    batch_size = 1 if args.batch_bytes else 32
    builder = RemoteDataLoader(targets, pipeline="bench").batch_size(batch_size)
    with builder.shared_memory(False).build() as loader:
        batches = iter(loader)
        next(batches)  # steady state: from the first batch on
        client, workers, start = _cpu_s(), _workers_cpu_s(pids), time.perf_counter()
        count = 0
        for _ in batches:
            count += 1
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
        seconds = time.perf_counter() - start
        client, workers = _cpu_s() - client, _workers_cpu_s(pids) - workers
    return {
        "workers": args.workers,
        "cost_ms": 0 if args.batch_bytes else args.cost_ms,
        "batch_bytes": args.batch_bytes,
        "step_ms": args.step_ms,
        "data_socket_from": args.data_socket_from,
        "data_port": not args.no_data_port,
        "batches": count,
        "records_per_s": round(count * batch_size / seconds),
        "client_cpu_us_per_batch": round(client / count * 1e6),
        "workers_cpu_us_per_batch": round(workers / count * 1e6),
        "load": round(os.getloadavg()[0], 2),
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _workers_cpu_s(pids: list[int]) -> float:
    """The user + system CPU seconds of processes `pids` so far (/proc)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
