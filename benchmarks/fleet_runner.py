"""R2's systems (see `fleet`): one `RemoteDataLoader` with default settings over a fleet of
`loadax-worker`s, built before the clock starts (its build time goes in the record).

Throughput and straggler runs use the driver's fleet (`--option grpc=...`, `--option zmq=...`). A
fault run starts two workers of its own, signals one after a quarter of the batches and records
the longest gap between batches from then on; its workers are always stopped, a stopped one too.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import fleet
from fleet import FleetRun
from harness import Setup, System, Trial, main
from services import Services

from loadax.client import RemoteDataLoader, RemoteLoader

SIGNALS = {"kill -9": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP, "SIGTERM": signal.SIGTERM}


def steady(run: FleetRun) -> System:
    """`run` over the driver's fleet."""

    def system(setup: Setup) -> Trial:
        targets = setup.option(run.transport).split(",")
        if len(targets) != run.workers:
            raise ValueError(f"{run.name} needs {run.workers} workers, got {targets}")
        loader, build_s = _build(run, setup, targets)
        extra = _extra(run, build_s)
        if run.step_ms:
            return Trial(lambda: _stepped(loader, run.step_ms, extra), loader.close, extra=extra)
        return Trial(lambda: loader, loader.close, extra=extra)

    return system


def faulty(run: FleetRun) -> System:
    """`run` over workers of its own, one of which gets `run.fault` mid-run."""
    if run.fault is None:
        raise ValueError(f"{run.name} has no fault")
    number = SIGNALS[run.fault]

    def system(setup: Setup) -> Trial:
        directory = Path(tempfile.mkdtemp(prefix="loadax-fleet-"))
        services = Services(directory, {"R2": setup.workload}, None)

        def stop_workers() -> None:
            services.stop()
            shutil.rmtree(directory, ignore_errors=True)

        try:
            options = services.options(fleet.service(run.workers))
            victim = int(options["pids"].split(",")[0])
            loader, build_s = _build(run, setup, options[run.transport].split(","))
        except BaseException:
            stop_workers()
            raise
        spec = setup.workload
        batches = -(-spec.records // spec.batch_size)
        fault = Fault(victim, number, fleet.STALL_CAP_S[spec.scale])
        extra = {**_extra(run, build_s), "fault_after_batches": max(1, batches // 4)}

        def close() -> None:
            try:
                loader.close()
            finally:
                fault.end()
                stop_workers()

        return Trial(lambda: _watched(loader, fault, extra), close, extra=extra)

    return system


class Fault:
    """Sends `number` to process `pid` once; a SIGSTOP ends (SIGCONT) after `cap` seconds, at
    `resumed_at` (`time.perf_counter()`), or at `end()`."""

    def __init__(self, pid: int, number: signal.Signals, cap: float) -> None:
        self._pid, self._number, self._cap = pid, number, cap
        self._timer: threading.Timer | None = None
        self.resumed_at: float | None = None

    def send(self) -> None:
        os.kill(self._pid, self._number)
        if self._number == signal.SIGSTOP:
            self._timer = threading.Timer(self._cap, self._resume, args=(True,))
            self._timer.daemon = True
            self._timer.start()

    def end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._resume(False)

    def _resume(self, capped: bool) -> None:
        if capped:
            self.resumed_at = time.perf_counter()
        with contextlib.suppress(ProcessLookupError):  # gone already
            os.kill(self._pid, signal.SIGCONT)


def _watched(loader: Iterable[Any], fault: Fault, extra: dict[str, Any]) -> Iterator[Any]:
    """The loader's batches, sending the fault after `extra["fault_after_batches"]`; writes the
    longest gap between consecutive batches before the fault (`gap_before_fault_s`) and from
    the fault on (`gap_after_fault_s`) into `extra`, and whether the stopped worker was resumed
    during the latter (`gap_capped`: it would have been longer)."""
    after = extra["fault_after_batches"]
    last: float | None = None
    for number, batch in enumerate(loader, start=1):
        now = time.perf_counter()
        if last is not None:
            key = "gap_before_fault_s" if number <= after else "gap_after_fault_s"
            if now - last >= extra.get(key, 0.0):
                extra[key] = now - last
                if key == "gap_after_fault_s":
                    resumed = fault.resumed_at
                    extra["gap_capped"] = resumed is not None and last <= resumed <= now
        last = now
        yield batch
        if number == after:
            fault.send()
            last = time.perf_counter()


def _stepped(loader: Iterable[Any], step_ms: int, extra: dict[str, Any]) -> Iterator[Any]:
    """The loader's batches, each followed by a training step of `step_ms` (a sleep); writes
    the median and p90 time of `next()` (`next_us_p50`, `next_us_p90`) and the process's CPU
    (user + system) per batch (`client_cpu_us_per_batch`) into `extra`."""
    iterator = iter(loader)
    took: list[float] = []
    cpu_before = _cpu_s()
    while True:
        started = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        took.append(time.perf_counter() - started)
        yield batch
        time.sleep(step_ms / 1000)
    if took:
        took.sort()
        extra["next_us_p50"] = took[len(took) // 2] * 1e6
        extra["next_us_p90"] = took[int(0.9 * (len(took) - 1))] * 1e6
        extra["client_cpu_us_per_batch"] = (_cpu_s() - cpu_before) / len(took) * 1e6


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _build(run: FleetRun, setup: Setup, targets: list[str]) -> tuple[RemoteLoader, float]:
    """The loader over `targets`, with default settings, and the seconds `build()` took."""
    started = time.perf_counter()
    loader = (
        RemoteDataLoader(targets, pipeline=run.pipeline)
        .batch_size(setup.workload.batch_size)
        .build()
    )
    return loader, time.perf_counter() - started


def _extra(run: FleetRun, build_s: float) -> dict[str, Any]:
    return {
        "transport": run.transport,
        "workers": run.workers,
        "slow": run.slow,
        "cost_ms": run.cost_ms,
        "fault": run.fault,
        "build_s": build_s,
    }


SYSTEMS: dict[str, System] = {
    run.name: faulty(run) if run.fault else steady(run) for run in fleet.RUNS
}

if __name__ == "__main__":
    main(SYSTEMS)
