"""R5 reuse (issue 28): each batch computed once, between jobs and across epochs.

(a) 4 jobs in processes of their own (each imported before the first job begins: a job starts
when it builds its loader), the same pipeline and plan, started 0-2 s apart with
different step times, on 2 `loadax-worker` processes running a CPU-heavy pipeline (W3's FFT, on
smaller arrays): the workers' CPU ÷ one job's alone, and each job's rate ÷ its rate alone;
(b) the same with a seed per job (nothing to share): the workers' CPU ÷ the four jobs' alone;
(c) a local loader over 3 epochs with `cache()` after an expensive decode: the CPU of epochs 2-3
÷ epoch 1's. Every job's batches are checked byte-identical to a local loader's.

Alone, each job runs on workers without a cache of replies (`share_cache_mb = 0`), one after the
other; (a) and (b) each on workers started afresh. Usage: `python benchmarks/r5_reuse.py
[--steps 40] [--rounds 3] [--out benchmarks/R5.md]`; `job` runs one job (the driver starts it).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from fleet_sim import RESULTS, write_section

import loadax
from loadax.client import RemoteDataLoader

BENCHMARKS = Path(__file__).resolve().parent
TITLE = "R5 reuse: each batch computed once"
"""R5's section in R5.md (which `benchmarks/report.py` renders into RESULTS.md) and RESULTS.md."""
RECORDS, SIDE, BATCH = 4096, 512, 8
CACHED_RECORDS, DECODED_SIDE = 192, 256
STEP_MS = (20, 30, 40, 50)  # each job's training step
STARTS_S = (0.0, 0.7, 1.3, 2.0)
WORKER_THREADS = 2


def heavy(records: int = RECORDS, side: int = SIDE) -> loadax.Pipeline[Any, Any]:
    """W3's transform on (side, side) float32 arrays: record i from default_rng(i)."""
    return loadax.Pipeline(loadax.RangeDataset(0, records).map(_fft), loadax.Batcher())


def _fft(index: int) -> np.ndarray[Any, Any]:
    x = np.random.default_rng(index).random((SIDE, SIDE), dtype=np.float32)
    return np.abs(np.fft.fft2(x)).astype(np.float32)[: SIDE // 2, : SIDE // 2]


def _decoded(index: int) -> dict[str, Any]:
    """An expensive decode (for (c)): ten FFTs of a record."""
    x = np.random.default_rng(index).random((DECODED_SIDE, DECODED_SIDE), dtype=np.float32)
    for _ in range(10):
        x = np.abs(np.fft.ifft2(np.fft.fft2(x))).astype(np.float32)
    return {"x": x[:16, :16], "label": np.int32(index)}


def _plan_loader(builder: Any, seed: int) -> Any:
    return builder.batch_size(BATCH).shuffle(seed=seed).num_epochs(1)


def digest(batches: Sequence[Any]) -> str:
    hashed = hashlib.sha256()
    for batch in batches:
        hashed.update(np.ascontiguousarray(np.asarray(batch)).tobytes())
    return hashed.hexdigest()


def local_digest(seed: int, steps: int) -> str:
    pipeline = heavy()
    loader = _plan_loader(loadax.DataLoader(pipeline.batcher), seed)
    batches = []
    for batch in loader.build(pipeline.dataset):
        batches.append(batch)
        if len(batches) == steps:
            break
    return digest(batches)


def job(targets: list[str], seed: int, step_ms: float, steps: int) -> dict[str, Any]:
    """One trainer: `steps` batches, a training step of `step_ms` after each."""
    builder = RemoteDataLoader(targets, pipeline="heavy").affinity(True)
    loader = _plan_loader(builder.prefetch(2), seed).build()
    batches, first = [], 0.0
    with loader:
        for batch in loader:
            batches.append(np.asarray(batch))
            if len(batches) == 1:
                first = time.perf_counter()
            if len(batches) == steps:
                break
            time.sleep(step_ms / 1000)  # the training step
        done = time.perf_counter()
        reuse = loader.stats().reuse
    return {
        "rate": (steps - 1) / (done - first),
        "digest": digest(batches),
        "hits": reuse.hits,
        "coalesced": reuse.coalesced,
        "misses": reuse.misses,
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(BENCHMARKS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}


@contextlib.contextmanager
def workers(folder: Path, share_cache_mb: int | None) -> Iterator[list[tuple[str, int]]]:
    """2 workers serving `heavy` (address, pid), with that reply cache (None: the default)."""
    started = []
    try:
        for number in range(2):
            config = folder / f"worker-{number}-{share_cache_mb}.toml"
            cache = "" if share_cache_mb is None else f"share_cache_mb = {share_cache_mb}\n"
            config.write_text(
                f'[server]\ngrpc = "127.0.0.1:0"\nthreads = {WORKER_THREADS}\n{cache}\n'
                '[pipelines.heavy]\nfactory = "r5_reuse:heavy"\n'
            )
            process = subprocess.Popen(
                [sys.executable, "-m", "loadax.server.main", "--config", str(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=child_env(),
            )
            assert process.stdout is not None
            ready = json.loads(process.stdout.readline())
            started.append((process, f"grpc://{ready['grpc']}"))
        yield [(address, process.pid) for process, address in started]
    finally:
        for process, _ in started:
            process.terminate()
            process.wait(timeout=10)


def run_jobs(
    fleet: list[tuple[str, int]], jobs: Sequence[tuple[int, float, float]], steps: int
) -> tuple[float, list[dict[str, Any]]]:
    """`jobs` (seed, step ms, start s) at once: the workers' CPU seconds and each job's report."""
    targets = ",".join(address for address, _ in fleet)
    before = sum(cpu_seconds(pid) for _, pid in fleet)
    processes = []
    for seed, step_ms, _ in jobs:  # started and imported before the first begins
        command = [sys.executable, __file__, "job", targets, str(seed), str(step_ms), str(steps)]
        processes.append(
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=child_env(),
            )
        )
    for process in processes:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"an R5 job (pid {process.pid}) did not start")
    began = time.perf_counter()
    for process, (_, _, start) in zip(processes, jobs, strict=True):
        time.sleep(max(0.0, began + start - time.perf_counter()))
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    reports = [json.loads(process.communicate()[0].splitlines()[-1]) for process in processes]
    return sum(cpu_seconds(pid) for _, pid in fleet) - before, reports


def epochs_cpu(epochs: int = 3) -> tuple[list[float], bool]:
    """(c): a local loader's CPU seconds per epoch with `cache()` after the decode, and whether
    its batches are those of the same loader without it."""

    def loader(dataset: Any) -> Any:
        return loadax.DataLoader(loadax.Batcher()).batch_size(32).shuffle(seed=1).build(dataset)

    cached = loader(loadax.RangeDataset(0, CACHED_RECORDS).map(_decoded).cache())
    plain = loader(loadax.RangeDataset(0, CACHED_RECORDS).map(_decoded))
    seconds, same = [], True
    for epoch in range(epochs):
        started = time.process_time()
        got = [batch["x"] for batch in cached.epoch(epoch)]
        seconds.append(time.process_time() - started)
        same &= digest(got) == digest([batch["x"] for batch in plain.epoch(epoch)])
    return seconds, same


def measure(steps: int) -> dict[str, Any]:
    """One round of (a), (b) and (c)."""
    shared = [(1, step_ms, start) for step_ms, start in zip(STEP_MS, STARTS_S, strict=True)]
    apart = [(11 + n, step_ms, start) for n, (_, step_ms, start) in enumerate(shared)]
    with tempfile.TemporaryDirectory() as folder:
        with workers(Path(folder), share_cache_mb=0) as fleet:
            alone = [run_jobs(fleet, [(seed, step_ms, 0.0)], steps) for seed, step_ms, _ in shared]
        with workers(Path(folder), share_cache_mb=None) as fleet:
            cpu_a, together = run_jobs(fleet, shared, steps)
        with workers(Path(folder), share_cache_mb=None) as fleet:
            cpu_b, separate = run_jobs(fleet, apart, steps)
    epochs, cached_same = epochs_cpu()
    one_job = statistics.median(cpu for cpu, _ in alone)
    rates = [
        job["rate"] / report["rate"] for job, (_, (report,)) in zip(together, alone, strict=True)
    ]
    expected = {seed: local_digest(seed, steps) for seed, _, _ in shared + apart}
    reports = [*zip(shared, together, strict=True), *zip(apart, separate, strict=True)]
    identical = all(report["digest"] == expected[seed] for (seed, _, _), report in reports)
    identical &= all(report["digest"] == expected[1] for _, (report,) in alone)
    return {
        "a_cpu_ratio": cpu_a / one_job,
        "a_rate_ratios": rates,
        "b_cpu_ratio": cpu_b / sum(cpu for cpu, _ in alone),
        "c_epoch_ratio": (epochs[1] + epochs[2]) / 2 / epochs[0],
        "identical": identical and cached_same,
        "one_job_cpu_s": one_job,
        "a_cpu_s": cpu_a,
        "epoch_cpu_s": epochs,
        "a_reuse": [{key: job[key] for key in ("hits", "coalesced", "misses")} for job in together],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=BENCHMARKS / "R5.md")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rounds = []
    for _ in range(args.rounds):
        rounds.append(measure(args.steps))
        print(json.dumps(rounds[-1]), flush=True)
    lines = render(rounds, args.steps, time.perf_counter() - began)
    for path in (args.out, RESULTS):
        write_section(path, TITLE, lines)
    return 0


def render(rounds: list[dict[str, Any]], steps: int, wall_s: float) -> list[str]:
    """R5's section (below its title): medians over the rounds, with min - max."""

    def cell(values: list[float], digits: int = 2) -> str:
        spread = (
            f" ({min(values):.{digits}f} - {max(values):.{digits}f})" if len(values) > 1 else ""
        )
        return f"{statistics.median(values):.{digits}f}{spread}"

    def median(key: str) -> float:
        return float(statistics.median(numbers[key] for numbers in rounds))

    jobs = range(len(STEP_MS))
    rates = [[numbers["a_rate_ratios"][job] for numbers in rounds] for job in jobs]
    verdicts = (
        median("a_cpu_ratio") <= 1.3,
        min(map(statistics.median, rates)) >= 0.9,
        median("b_cpu_ratio") <= 1.05,
        median("c_epoch_ratio") <= 0.2,
    )
    met = ["met" if verdict else "missed" for verdict in verdicts]
    last = rounds[-1]
    reuse = "; ".join(
        f"{job['hits']} cached, {job['coalesced']} coalesced, {job['misses']} computed"
        for job in last["a_reuse"]
    )
    epochs = ", ".join(f"{seconds:.2f}" for seconds in last["epoch_cpu_s"])
    identical = all(numbers["identical"] for numbers in rounds)
    return [
        f"`python benchmarks/r5_reuse.py --steps {steps} --rounds {len(rounds)}` ({wall_s:.0f} "
        "s; 2 shared, noisy cores; written by the script); medians over the rounds, min - max. "
        f"2 `loadax-worker` processes ({WORKER_THREADS} threads each) serve an FFT pipeline "
        f"(batch {BATCH} of {SIDE}x{SIDE} float32); each job is a process of its own reading "
        f"{steps} batches with `RemoteDataLoader(...).affinity(True)`, a training step of "
        f"{'/'.join(map(str, STEP_MS))} ms, started {'/'.join(map(str, STARTS_S))} s apart "
        "(each job's process imports before the first job begins: a job starts when it builds "
        "its loader). "
        "Alone, each job runs by itself on workers without a reply cache (`share_cache_mb = 0`).",
        "",
        "| case | measured | target | verdict |",
        "|---|---|---|---|",
        f"| (a) 4 jobs, one plan: workers' CPU ÷ one job's alone | "
        f"{cell([numbers['a_cpu_ratio'] for numbers in rounds])} | ≤ 1.3 | {met[0]} |",
        f"| (a) each job's rate ÷ its rate alone | "
        f"{', '.join(cell(job) for job in rates)} | each ≥ 0.9 | {met[1]} |",
        f"| (b) 4 jobs, a seed each: workers' CPU ÷ the 4 alone | "
        f"{cell([numbers['b_cpu_ratio'] for numbers in rounds])} | ≤ 1.05 | {met[2]} |",
        f"| (c) `cache()` after the decode: epochs 2-3 CPU ÷ epoch 1 | "
        f"{cell([numbers['c_epoch_ratio'] for numbers in rounds], 3)} | ≤ 0.2 | {met[3]} |",
        "",
        f"Every job's batches byte-identical to a local loader's, in every round: {identical}. "
        f"In the last round one job alone cost the workers {last['one_job_cpu_s']:.2f} CPU s "
        f"and the 4 of (a) {last['a_cpu_s']:.2f}; (a)'s jobs' replies: {reuse}; (c)'s CPU s "
        f"per epoch: {epochs}.",
        "",
        "Here the 4 job processes and the 2 workers share the machine's 2 cores: a job's rate "
        "together depends on the CPU the other jobs' processes take from it (the first, which "
        "makes the batches the others read from the cache, most), not on the workers. Before "
        "the jobs imported ahead of their start, the later jobs' interpreter and JAX start-up "
        "ran during the first job's timed batches (first job 0.79x its rate alone).",
    ]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        targets, seed, step_ms, steps = sys.argv[2:6]
        print("ready", flush=True)  # imported: a job's start is its loader's build
        sys.stdin.readline()
        report = job(targets.split(","), int(seed), float(step_ms), int(steps))
        print(json.dumps(report))
    else:
        sys.exit(main())
