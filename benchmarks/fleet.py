"""R2 "fleet": the runs it makes (worker counts, per-record costs, the straggler, the faults) and
the workers they run on; shared by the catalog, the driver's services, the runner and the report.

Each record costs a GIL-releasing sleep, so a worker's capacity is `THREADS / cost` records/s
whatever the machine's cores, and a fleet of N should make N times that.
"""

from __future__ import annotations

import dataclasses

TRANSPORTS = {"grpc": "gRPC", "zmq": "ZeroMQ"}
"""The key of a transport's addresses in a service's options, and its name in tables."""
COSTS_MS = (5, 20)
WORKER_COUNTS = (1, 2, 4, 8, 16)
THREADS = 8
"""`threads` in every fleet worker's config: a batch of 32 is 8 chunks of 4 records."""
STRAGGLER_COST_MS = 20
SLOWDOWN = 10
SLOWDOWN_ENV = "LOADAX_BENCH_SLOWDOWN"
"""Read by each record's transform: how many times slower than its cost the record is."""
FAULTS = ("kill -9", "SIGSTOP", "SIGTERM")
FAULT_WORKERS, FAULT_COST_MS = 2, 20
FIRST_BATCH_WORKERS = (1, 8)
EFFICIENCY_WORKERS, EFFICIENCY_COST_MS = 8, 20
CLIENT_COST_WORKERS, CLIENT_COST_MS, STEP_MS = 4, 5, 10
"""The client-cost run: a training step of `STEP_MS` (a sleep) after each batch, longer than the
fleet takes over one, so that `next()` mostly finds its batch ready."""
STALL_CAP_S = {"full": 15.0, "quick": 5.0, "smoke": 3.0}
"""How long a SIGSTOPped worker stays stopped before it is continued: the gap is then "at least
this". Above ZeroMQ's heartbeat timeout (10 s), so that it can show at the full scale."""


@dataclasses.dataclass(frozen=True, slots=True)
class FleetRun:
    """One R2 system: `workers` workers over `transport`, `slow` of them `SLOWDOWN` times slower,
    and `fault` sent to one of them mid-run."""

    transport: str
    workers: int
    cost_ms: int
    slow: int = 0
    fault: str | None = None
    step_ms: int = 0  # a simulated training step after each batch

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {self.transport!r}")
        if not 0 <= self.slow < self.workers:
            raise ValueError(f"slow must be in [0, workers={self.workers}), got {self.slow}")
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS} or None, got {self.fault!r}")

    @property
    def name(self) -> str:
        workers = f"{self.healthy}w + {self.slow} slow" if self.slow else f"{self.workers}w"
        fault = f" {self.fault}" if self.fault else ""
        step = f" step {self.step_ms}ms" if self.step_ms else ""
        return f"loadax {TRANSPORTS[self.transport]} {workers} {self.cost_ms}ms{fault}{step}"

    @property
    def healthy(self) -> int:
        return self.workers - self.slow

    @property
    def pipeline(self) -> str:
        return pipeline_name(self.cost_ms)

    @property
    def service(self) -> str | None:
        """The shared workers it runs on; None for a fault run, which starts (and kills) its own."""
        return None if self.fault else service(self.healthy, self.slow)


def pipeline_name(cost_ms: int) -> str:
    return f"r2_{cost_ms}ms"


def service(healthy: int, slow: int = 0) -> str:
    """The name of the service of the first `healthy` fleet workers and `slow` slow ones."""
    return f"loadax-worker fleet x{healthy}" + (f" + {slow} slow" if slow else "")


def _runs() -> tuple[FleetRun, ...]:
    # Adjacent runs differ in one thing, so that A B A B compares them under the same load.
    runs = [
        FleetRun(transport, workers, cost)
        for cost in COSTS_MS
        for workers in WORKER_COUNTS
        for transport in TRANSPORTS
    ]
    for transport in TRANSPORTS:
        runs.append(FleetRun(transport, 3, STRAGGLER_COST_MS))
        runs.append(FleetRun(transport, 4, STRAGGLER_COST_MS, slow=1))
    runs += [
        FleetRun(transport, CLIENT_COST_WORKERS, CLIENT_COST_MS, step_ms=STEP_MS)
        for transport in TRANSPORTS
    ]
    runs += [
        FleetRun(transport, FAULT_WORKERS, FAULT_COST_MS, fault=fault)
        for fault in FAULTS
        for transport in TRANSPORTS
    ]
    return tuple(runs)


RUNS = _runs()
SERVICES: dict[str, tuple[int, int]] = {
    service(healthy, slow): (healthy, slow)
    for healthy, slow in {(run.healthy, run.slow) for run in RUNS} | {(FAULT_WORKERS, 0)}
}
"""Every fleet service by name: (healthy workers, slow workers)."""
