"""Where a remote loader's CPU goes, in steady state: `--workers` `loadax-worker`s (default 1; 2
threads each) on loopback serving T1 (pre-built batches of 8 or 64 MiB, or `--batch-bytes`), R1
(W2's images) or W3 (its CPU-heavy FFTs) to a `RemoteDataLoader` (prefetch 4) in this process,
or R1 or W3 from the local loader (2 threads) for comparison.

After `--warmup` batches it measures the rest: GB/s, the client's and the workers' CPU seconds
per GB (user + system, the workers' children included) and the client's minor page faults per
GB; the loading threads' CPU and faults per GB (`/proc/PID/task/*/stat` of the workers, or of
this process for the local loader: its 2 busiest threads each) beside the CPU of that process's
other threads and its peak RSS, so that a worker's and a local loader's record work compare
directly; then the CPU per GB of a raw TCP send (`raw_send_cpu`), for issue 26's target of a
worker: the local loader's CPU per GB plus 1.5 x that. With `--perf client|worker` it also
records that process (the first worker) with `perf record -g` over the same span and prints the
symbols that took the most of its samples (perf must be installed).

    .venv/bin/python benchmarks/profile_remote.py T1 zmq --perf client
    .venv/bin/python benchmarks/profile_remote.py R1 zmq --perf worker
    .venv/bin/python benchmarks/profile_remote.py R1 local
    .venv/bin/python benchmarks/profile_remote.py W3 zmq --epochs 1
    .venv/bin/python benchmarks/profile_remote.py T1 zmq --sockets   # without the same-host path
    .venv/bin/python benchmarks/profile_remote.py T1 zmq --sockets --batch-bytes 65536  # per batch
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import bench_pipelines
import jax
from local_worker import HERE, worker
from workloads import T1_BATCH_BYTES, prepare, workload

import loadax
from loadax.client import RemoteDataLoader

PREFETCH = 4
LOADING_THREADS = 2
"""The threads that load records: the local loader's, and each worker's (`threads`)."""
PIPELINES = {"R1": bench_pipelines.w2, "W3": bench_pipelines.w3}
"""The workloads that run a pipeline (the others send pre-built batches), by their factories."""
TOP_SYMBOLS = 15
RAW_SEND_BYTES = 8 << 20
RAW_SEND_TOTAL = 1 << 30


def config(
    directory: Path,
    name: str,
    batches: int,
    transport: str,
    threads: int = LOADING_THREADS,
    batch_bytes: int = 0,
) -> Path:
    """A worker config serving `name`'s pipeline (R1, W3: their full-scale files, written once)
    on `threads` loading threads; T1's batches of `batch_bytes` (0: the workload's)."""
    if name in PIPELINES:
        factory = PIPELINES[name].__name__
        pipeline = f'factory = "bench_pipelines:{factory}"\nargs = {{ path = "{data(name)}" }}'
    else:
        args = f"batches = {batches}, batch_bytes = {batch_bytes or T1_BATCH_BYTES[name]}"
        pipeline = f'factory = "bench_pipelines:t1"\nargs = {{ {args} }}'
    listen = 'grpc = "127.0.0.1:0"' if transport == "grpc" else 'zmq = "tcp://127.0.0.1:0"'
    path = directory / "worker.toml"
    # Replies are not kept (a profile measures making and moving batches).
    server = f"[server]\n{listen}\nthreads = {threads}\nshare_cache_mb = 0\n"
    path.write_text(f"{server}\n[pipelines.p]\n{pipeline}\n")
    return path


def data(name: str) -> Path:
    """The full-scale file that R1 (W2's) or W3 reads, written once (as run.py does)."""
    spec = workload(name, "full", HERE.parent / ".bench" / "data")
    prepare(spec)
    return spec.data_file()


def r1_data() -> Path:
    """The full-scale W2 file that R1 reads."""
    return data("R1")


def _stat_fields(path: Path) -> list[str]:
    """The fields of a `/proc` stat file after the command's name (the process state first)."""
    return path.read_text().rsplit(")", 1)[1].split()


def process_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and its waited-for children (user + system)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory of process `pid` so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def thread_usage(pid: int) -> dict[int, tuple[float, int]]:
    """Each live thread of process `pid`: its CPU seconds (user + system) and minor faults."""
    usage = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = _stat_fields(task / "stat")
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        usage[int(task.name)] = (cpu, int(fields[7]))
    return usage


def loading_share(
    before: dict[int, tuple[float, int]], after: dict[int, tuple[float, int]], loading: int
) -> tuple[float, float, int]:
    """CPU seconds and minor faults of a process's `loading` busiest threads between two
    `thread_usage` readings (on W3 and R1 its loading threads), and the CPU of its others."""
    spent = sorted(
        (
            (cpu - before.get(tid, (0.0, 0))[0], faults - before.get(tid, (0.0, 0))[1])
            for tid, (cpu, faults) in after.items()
        ),
        reverse=True,
    )
    busiest, others = spent[:loading], spent[loading:]
    return sum(cpu for cpu, _ in busiest), sum(cpu for cpu, _ in others), sum(f for _, f in busiest)


@contextmanager
def perf(pid: int, out: Path) -> Iterator[None]:
    """`perf record -g` of process `pid` while the block runs."""
    command = ["perf", "record", "-q", "-g", "-o", str(out), "-p", str(pid)]
    recorder = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf attaches to every thread of the process before the span starts
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=60)


def top_symbols(data: Path) -> str:
    """The symbols with the most samples in perf's `data` (with their process's thread names)."""
    report = ["perf", "report", "-i", str(data), "--no-children", "-q", "-g", "none"]
    shown = subprocess.run(
        [*report, "--sort", "comm,dso,sym"], capture_output=True, text=True, check=True
    )
    return "\n".join(shown.stdout.splitlines()[:TOP_SYMBOLS])


def raw_send_cpu() -> float:
    """CPU seconds per GB of the floor of a send: `sendall` of one reused 8 MiB buffer over
    loopback TCP to a thread that receives into a reused buffer (as T1's raw TCP), the sending
    thread's own CPU (`RUSAGE_THREAD`), measured in the run it is compared with."""
    listener = socket.create_server(("127.0.0.1", 0))

    def receive() -> None:
        connection, _ = listener.accept()
        buffer = memoryview(bytearray(RAW_SEND_BYTES))
        with connection:
            while connection.recv_into(buffer):
                pass

    receiver = threading.Thread(target=receive)
    receiver.start()
    payload = memoryview(bytearray(RAW_SEND_BYTES))
    with socket.create_connection(listener.getsockname()) as connection:
        before = resource.getrusage(resource.RUSAGE_THREAD)
        for _ in range(RAW_SEND_TOTAL // RAW_SEND_BYTES):
            connection.sendall(payload)
        after = resource.getrusage(resource.RUSAGE_THREAD)
    receiver.join()
    listener.close()
    seconds = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return seconds / (RAW_SEND_TOTAL / 1e9)


class Loader(Protocol):
    """What `measure` reads: batches, and how many an iteration gives."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


def measure(
    batches: Loader, warmup: int, worker_pids: list[int], profiled: int | None, out: Path
) -> dict[str, float]:
    """GB/s, CPU s/GB of this process and of the `worker_pids` together, and this process's
    faults/GB over `batches` after `warmup` of them; the same span's CPU s/GB and faults/GB of
    the loading threads (each loading process's `LOADING_THREADS` busiest: the workers', or
    this process's for the local loader), the CPU s/GB of that process's other threads and its
    peak RSS;
    `profiled` is the process to record with perf, if any."""
    iterator = iter(batches)
    for _ in range(warmup):
        next(iterator)
    loading_pids = worker_pids or [os.getpid()]
    with perf(profiled, out) if profiled is not None else nullcontext():
        workers_before = sum(process_cpu(pid) for pid in worker_pids)
        threads_before = [thread_usage(pid) for pid in loading_pids]
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        # The last batch counted, not the end of the iterator: a local loader's threads end there.
        received = sum(
            sum(leaf.nbytes for leaf in jax.tree.leaves(next(iterator)))
            for _ in range(len(batches) - warmup)
        )
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        threads_after = [thread_usage(pid) for pid in loading_pids]
        worker_cpu = sum(process_cpu(pid) for pid in worker_pids) - workers_before
    if next(iterator, None) is not None:
        raise RuntimeError(f"more batches than the loader's length, {len(batches)}")
    gb = received / 1e9
    client_cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    shares = [
        loading_share(first, last, LOADING_THREADS)
        for first, last in zip(threads_before, threads_after, strict=True)
    ]
    loading_cpu, other_cpu, loading_faults = (sum(column) for column in zip(*shares, strict=True))
    return {
        "GB/s": round(gb / seconds, 3),
        "client CPU s/GB": round(client_cpu / gb, 3),
        "worker CPU s/GB": round(worker_cpu / gb, 3),
        "client faults/GB": round((after.ru_minflt - before.ru_minflt) / gb),
        "loading threads CPU s/GB": round(loading_cpu / gb, 3),
        "loading threads faults/GB": round(loading_faults / gb),
        "other threads CPU s/GB": round(other_cpu / gb, 3),
        "threads": sum(len(usage) for usage in threads_after),
        "loading peak RSS MiB": round(sum(peak_rss_mib(pid) for pid in loading_pids)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["T1", "T1-64M", *PIPELINES])
    parser.add_argument("system", choices=["zmq", "grpc", "local"])
    parser.add_argument("--batches", type=int, default=0, help="T1's (default: about 4 GB)")
    parser.add_argument(
        "--batch-bytes", type=int, default=0, help="T1's batches' size (default: the workload's)"
    )
    parser.add_argument("--epochs", type=int, default=3, help="R1's or W3's")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--perf", choices=["client", "worker"])
    parser.add_argument("--perf-out", type=Path, default=Path("perf.data"))
    parser.add_argument(
        "--sockets",
        action="store_true",
        help="batches over the sockets, as from other hosts (no same-host shared memory)",
    )
    args = parser.parse_args()
    if args.system == "local" and args.workload not in PIPELINES:
        parser.error("the local loader is measured on R1 and W3 only")
    if args.system == "local" and (args.perf == "worker" or args.workers != 1):
        parser.error("the local loader has no worker")
    if args.batch_bytes and args.workload in PIPELINES:
        parser.error("--batch-bytes sizes T1's pre-built batches only")
    batch_bytes = args.batch_bytes or T1_BATCH_BYTES.get(args.workload, 1)
    batches = args.batches or (4 << 30) // batch_bytes
    batch_size = workload(args.workload, "full", Path()).batch_size
    with tempfile.TemporaryDirectory() as directory:
        if args.system == "local":
            pipeline = PIPELINES[args.workload](str(data(args.workload)))
            loader = (
                loadax.DataLoader(pipeline.batcher)
                .batch_size(batch_size)
                .workers(LOADING_THREADS)
                .prefetch(PREFETCH)
                .num_epochs(args.epochs)
                .build(pipeline.dataset)
            )
            profiled = os.getpid() if args.perf else None
            result = measure(loader, args.warmup, [], profiled, args.perf_out)
        else:
            settings = config(
                Path(directory),
                args.workload,
                batches + args.warmup,
                args.system,
                batch_bytes=args.batch_bytes,
            )
            with ExitStack() as stack:
                served = [
                    stack.enter_context(worker(settings, args.system)) for _ in range(args.workers)
                ]
                addresses = [one.address for one in served]
                builder = (
                    RemoteDataLoader(addresses, pipeline="p")
                    .prefetch(PREFETCH)
                    .shared_memory(not args.sockets)
                )
                if args.workload in PIPELINES:
                    builder = builder.batch_size(batch_size).num_epochs(args.epochs)
                else:
                    builder = builder.batch_size(1)
                pids = [one.pid for one in served]
                profiled = {"client": os.getpid(), "worker": pids[0], None: None}[args.perf]
                with builder.build() as loader:
                    result = measure(loader, args.warmup, pids, profiled, args.perf_out)
    print(
        json.dumps(
            {
                "workload": args.workload,
                "system": args.system,
                "workers": args.workers,
                "shared_memory": args.system != "local" and not args.sockets,
                **result,
                "raw TCP send CPU s/GB": round(raw_send_cpu(), 3),
            }
        )
    )
    if args.perf:
        print(f"perf record of the {args.perf}, top symbols:\n{top_symbols(args.perf_out)}")


if __name__ == "__main__":
    main()
