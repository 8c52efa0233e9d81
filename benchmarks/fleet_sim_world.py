"""The world around the simulated trainers (`fleet_sim.py`): the fleet's shape (`World`), the
faults on its schedule (`Fault`) and each simulated worker (`SimWorker`: loading slots, a FIFO
queue, the in-flight limit it announces to each client, and what it does when killed, hung,
slowed or removed). Pure state: time comes in as `now`; the simulation keeps the clock.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from typing import Literal

from loadax.wire.load import DecayingRate

FaultKind = Literal["kill", "hang", "slow", "add", "remove", "rename"]
FAULT_KINDS: tuple[FaultKind, ...] = ("kill", "hang", "slow", "add", "remove", "rename")


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """At `at` seconds: `kill` (its work fails as UNAVAILABLE once the lost connection is
    noticed; what is sent to it later is refused in a round trip), `hang` (never answers
    again), `slow` (service x `factor`), `remove` or `rename` (a DNS change: removed, and
    listed again under a new name) that share of the workers up then (`amount` in (0, 1]);
    `add` `amount` new ones."""

    kind: FaultKind
    at: float
    amount: float
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        if not math.isfinite(self.at) or self.at < 0:
            raise ValueError(f"a {self.kind} fault's time must be >= 0 seconds, got {self.at!r}")
        if self.kind == "add":
            if self.amount != int(self.amount) or self.amount < 1:
                raise ValueError(f"add takes a whole number of workers >= 1, got {self.amount}")
        elif not 0 < self.amount <= 1:
            raise ValueError(
                f"{self.kind} takes a share of the workers in (0, 1], got {self.amount}"
            )
        if self.kind == "slow" and not self.factor > 0:
            raise ValueError(f"a slow-down factor must be > 0, got {self.factor}")


@dataclasses.dataclass(frozen=True, slots=True)
class World:
    """The simulated fleet (seconds for times): `workers` workers of `threads` loading slots,
    each batch taking `service_s` (x a lognormal of `service_sigma` when > 0; a `stragglers`
    share of the workers `straggler_factor` x slower); `trainers` trainer hosts, each with a
    training step of `step_s` (spread uniformly by +-`step_spread` of it between trainers)
    and `prefetch` batches ready; a network round trip of `rtt_s`; a lost connection, or a
    connect to a worker that is not up, noticed after `loss_s`; each worker takes `limit`
    requests at once from one client; a worker's first batch takes `cold_s` more (its pool and
    pipeline warming up). With `batches`, each trainer's loop ends after that many (an epoch),
    else it runs for `seconds`. With `digests`, each request names what it asks for, as a real
    client's does (each trainer a job of its own: no two ask alike), and placement breaks ties
    by it (`loadax.client.affinity`). With `host_cores`, every batch also takes `host_cpu_s` of
    one of that many cores shared by the whole fleet and its trainers (R2's workers and client on
    one machine), in the order batches finish loading; 0: each host has cores to spare."""

    workers: int
    trainers: int
    seconds: float
    threads: int = 8
    service_s: float = 0.02
    service_sigma: float = 0.0
    stragglers: float = 0.0
    straggler_factor: float = 10.0
    step_s: float = 0.1
    step_spread: float = 0.0
    rtt_s: float = 0.001
    loss_s: float = 0.1
    limit: int = 16
    prefetch: int = 2
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    batches: int | None = None
    cold_s: float = 0.0
    digests: bool = False
    host_cores: int = 0
    host_cpu_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("workers", "trainers", "threads", "limit", "prefetch", "batches"):
            value = getattr(self, name)
            if name == "batches" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("seconds", "service_s", "step_s", "straggler_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        cores = self.host_cores
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 0:
            raise ValueError(f"host_cores must be an int >= 0, got {cores!r}")
        for name in ("service_sigma", "rtt_s", "loss_s", "cold_s", "host_cpu_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("stragglers", "step_spread"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")


class SharedCores:
    """`count` cores that every batch needs `seconds` of, taken in turn (FIFO)."""

    def __init__(self, count: int, seconds: float) -> None:
        self._free, self._seconds = count, seconds
        self._waiting: deque[Job] = deque()

    def enter(self, job: Job, now: float) -> list[tuple[float, Job]]:
        """`job` needs a core: (when it is done, the job) if one is free now."""
        self._waiting.append(job)
        return self._start(now)

    def leave(self, now: float) -> list[tuple[float, Job]]:
        """A job's core is free: the job that takes it, if any."""
        self._free += 1
        return self._start(now)

    def _start(self, now: float) -> list[tuple[float, Job]]:
        started = []
        while self._free and self._waiting:
            self._free -= 1
            started.append((now + self._seconds, self._waiting.popleft()))
        return started


@dataclasses.dataclass(eq=False, slots=True)
class Job:
    """One attempt held by a worker: whose (`trainer`, `attempt`), and where it stands."""

    trainer: int
    attempt: int
    held: bool = False  # counted against its client's limit
    running: bool = False
    cancelled: bool = False
    load: float = 0.0  # its worker's, per loading slot, when it was loaded (`loadax.wire.load`)


class SimWorker:
    """One worker: `threads` slots, a FIFO queue, at most `limit` requests held per client
    (more is RESOURCE_EXHAUSTED); `state` up, dead (killed), hung or gone (removed)."""

    def __init__(self, name: str, world: World, factor: float, rng: random.Random) -> None:
        self.name, self.factor, self._rng = name, factor, rng
        self._threads, self._service, self._sigma = (
            world.threads,
            world.service_s,
            world.service_sigma,
        )
        self.limit = world.limit
        self._cold = world.cold_s  # added to its first batch
        self.state: Literal["up", "dead", "hung", "gone"] = "up"
        self.requests = 0  # attempts taken in (refusals aside)
        self.connections = 0  # trainers connected to it
        self.cover = 0.0  # its shares of the trainers' apertures, summed over the run's looks
        self._queue: deque[Job] = deque()
        self._running: dict[Job, None] = {}  # a dict: in the order they started
        self._held: dict[int, int] = {}  # trainer -> requests held (queued or loading)
        self._arrivals = DecayingRate()  # of the requests it took in, for its replies' load

    def arrive(self, job: Job, now: float) -> tuple[list[tuple[float, Job]], bool]:
        """`job` reaches the worker: (the jobs it starts, with when each is done; whether it is
        refused as over the client's limit)."""
        held = self._held.get(job.trainer, 0)
        if held >= self.limit:
            return [], True
        self._held[job.trainer] = held + 1
        job.held = True
        self.requests += 1
        self._arrivals.add(now)
        self._queue.append(job)
        return self._start(now), False

    def cancel(self, job: Job) -> None:
        """A cancel reaches the worker: a queued job is dropped, a loading one's reply is."""
        if job.cancelled:
            return
        job.cancelled = True
        if not job.running:
            self._release(job)

    def done(self, job: Job, now: float) -> list[tuple[float, Job]]:
        """`job` is loaded; the jobs that start in its slot."""
        del self._running[job]
        job.load = self._arrivals.at(now) / self._threads
        self._release(job)
        return self._start(now)

    def fail_all(self) -> list[Job]:
        """Killed: every job it held, not cancelled, fails (their connection is lost)."""
        held = [job for job in (*self._running, *self._queue) if not job.cancelled]
        for job in held:
            job.held = False
        self._running.clear()
        self._queue.clear()
        self._held.clear()
        return held

    def _start(self, now: float) -> list[tuple[float, Job]]:
        started = []
        while self._queue and len(self._running) < self._threads:
            job = self._queue.popleft()
            if job.cancelled:
                continue  # released when its cancel came
            job.running = True
            self._running[job] = None
            started.append((now + self._service_time(), job))
        return started

    def _service_time(self) -> float:
        service = self._service * self.factor + self._cold
        self._cold = 0.0
        if self._sigma:  # mean-preserving: the median is below the mean
            service *= self._rng.lognormvariate(-(self._sigma**2) / 2, self._sigma)
        return service

    def _release(self, job: Job) -> None:
        if job.held:
            job.held = False
            self._held[job.trainer] -= 1
