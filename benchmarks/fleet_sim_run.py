"""The simulation of `fleet_sim.py`: T trainer hosts, each with its own real
`loadax.client.policy.Policy`, on a virtual clock (a heap of timed events) over the workers of
`fleet_sim_world.py`.

It plays only the world around the policy (no copy of its rules): what `client/driver.py` does
with its actions (Send: the worker takes the work; Cancel: the worker drops it if queued;
Resolve/Fail: the batch is delivered or fails; Connect: `Joined` a round trip later if the worker
is up, else `Unreachable` once the failure is noticed; Disconnect: the connection closes), what
membership tells it (at the start the trainer's arc of `subset` workers `Joined`, as `build()`
asks them, and the others `Listed`; an added worker `Listed`, a removed one `Left`; a DNS change
is both, under a new name) and when it ticks (a Tick when an event comes at
or after `wake_at`, or when nothing came by then), and what the iterator (`RemoteExecutor`,
`BatchIterator`) does with `depth`: `prefetch + depth(now)` requests submitted in step order,
one batch taken per training step.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
import time
from collections import deque
from typing import Any

from fleet_sim_report import report
from fleet_sim_world import Fault, Job, SharedCores, SimWorker, World

from loadax.client.fleet_events import (
    Action,
    Answered,
    Cancel,
    Connect,
    Disconnect,
    Event,
    Fail,
    Failed,
    Joined,
    Left,
    Listed,
    Resolve,
    Send,
    Submit,
    Tick,
    Unreachable,
    Withdraw,
)
from loadax.client.fleet_options import FleetOptions
from loadax.client.policy import Policy
from loadax.client.subset import Seat, aperture
from loadax.errors import WorkerError

# Timed events: (time, sequence, kind, a, b); the sequence keeps equal times in order.
_ARRIVE, _DONE, _CANCEL, _REPLY, _TAKE, _TIMER, _FAULT, _HANDSHAKE, _LOOK, _CPU = range(10)
_LOOK_EVERY = 0.5  # seconds between looks at the trainers' apertures
_CPU_SAMPLE = 16


class SimTrainer:
    """One trainer host: its policy, its training loop's window of requests (`BatchIterator`'s
    in-flight deque) and what it saw."""

    def __init__(self, index: int, step_s: float, options: FleetOptions, seat: Seat) -> None:
        self.index, self.step_s = index, step_s
        self.policy = Policy(options, seat)
        self.connected: set[str] = set()  # as the policy's members: Joined, not yet let go
        self.window: deque[tuple[int, int]] = deque()  # (step, request), submitted in order
        self.next_submit = 0
        self.requests = itertools.count(1)
        self.outcomes: dict[int, bool] = {}  # request -> delivered (True) or failed (False)
        self.attempts: dict[int, tuple[SimWorker, Job]] = {}  # the driver's live attempts
        self.sent_requests: set[int] = set()
        self.current: tuple[int, int] | None = None  # the batch the loop waits for
        self.wanted_at = 0.0  # since when the loop has wanted its next batch
        self.retrying = False  # its last batch failed: the loop retries that step
        self.first_batch: float | None = None
        self.finished: float | None = None  # when the loop took its last batch (`World.batches`)
        self.last_batch: float | None = None
        self.longest_gap = (0.0, 0.0)  # (the gap, when it ended)
        self.longest_after_fault = 0.0  # of the gaps that ended after the first fault
        self.gaps: list[float] = []
        self.delivered = self.failures = 0
        self.stalled = 0.0
        self.wake: float | None = None
        self.timer_at: float | None = None


class Simulation:
    """Runs `world` for its `seconds` with each trainer's policy made from `options`."""

    def __init__(self, world: World, options: FleetOptions | None = None) -> None:
        self.world, self.options = world, options or FleetOptions()
        self._rng = random.Random(world.seed)
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = itertools.count()
        self.workers: dict[str, SimWorker] = {}
        self._cores = SharedCores(world.host_cores, world.host_cpu_s) if world.host_cores else None
        straggling = set(
            self._rng.sample(range(world.workers), round(world.stragglers * world.workers))
        )
        for index in range(world.workers):
            self._new_worker(world.straggler_factor if index in straggling else 1.0)
        self.trainers = [
            SimTrainer(
                index,
                world.step_s * (1 + world.step_spread * self._rng.uniform(-1, 1)),
                self.options,
                Seat.of(index, world.trainers, "sim"),
            )
            for index in range(world.trainers)
        ]
        self.attempts = self.lost = self.refusals = self.decisions = self.ticks = self.events = 0
        self.unreachable = 0
        # The policy's CPU, read around one call in `_CPU_SAMPLE` (the clock costs up to 10 us a
        # read here: read at every call, it was a third of a run).
        self.policy_cpu, self.sampled, self._calls = 0.0, 0, 0
        self._first_fault = min((fault.at for fault in world.faults), default=world.seconds)
        self.connections_per_trainer_max = self.connections_per_worker_max = 0

    # The run.

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        ring = sorted(self.workers)
        cap = self.options.subset
        for trainer in self.trainers:
            # As `client/membership.py`: build() asks the trainer's arc of `subset` of the
            # addresses (all of them when fewer) and lists the others once bound.
            asked = aperture(ring, trainer.policy.seat, cap, lambda name: True, cap)
            for name in asked:
                self._handshake(trainer, self.workers[name], 0.0)
            for name in ring:
                if name not in asked:
                    self._decide(trainer, Listed(name), 0.0)
        for index, fault in enumerate(self.world.faults):
            self._push(fault.at, _FAULT, index, None)
        self._push(_LOOK_EVERY, _LOOK, None, None)
        for trainer in self.trainers:  # the loop's first next(), a round trip after build()
            self._push(self.world.rtt_s, _TAKE, trainer, None)
        end, heap = self.world.seconds, self._heap
        while heap and heap[0][0] <= end:
            now, _, kind, a, b = heapq.heappop(heap)
            self.events += 1
            if kind == _ARRIVE:
                self._arrive(a, b, now)
            elif kind == _DONE:
                self._done(a, b, now)
            elif kind == _CANCEL:
                a.cancel(b)
            elif kind == _REPLY:
                self._reply(a, b, now)
            elif kind == _TAKE:
                self._next_batch(a, now)
            elif kind == _TIMER:
                self._timer(a, now)
            elif kind == _HANDSHAKE:
                self._handshake(a, b, now)
            elif kind == _LOOK:
                self._look(now)
            elif kind == _CPU:
                self._computed(b, now)
            else:
                self._fault(self.world.faults[a], now)
        return report(self, time.perf_counter() - started)

    def _push(self, when: float, kind: int, a: Any, b: Any) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), kind, a, b))

    # The driver: events to the policy, its actions carried out.

    def _decide(self, trainer: SimTrainer, event: Event | None, now: float) -> None:
        events: list[Event] = [] if event is None else [event]
        ticked = trainer.wake is not None and now >= trainer.wake
        if ticked:
            events.append(Tick())
        policy, actions = trainer.policy, []
        self._calls += 1
        sampled = self._calls % _CPU_SAMPLE == 0
        cpu = time.process_time() if sampled else 0.0
        for each in events:
            actions += policy.decide(each, now)
        if sampled:
            self.policy_cpu += time.process_time() - cpu
            self.sampled += len(events)
        # As the driver: a tick at the policy's next deadline (never put off by events).
        wake = trainer.wake = policy.wake_at(now)
        self.decisions += len(events)
        self.ticks += len(events) - (event is not None)
        if wake is not None and (trainer.timer_at is None or wake < trainer.timer_at):
            trainer.timer_at = wake
            self._push(wake, _TIMER, trainer, None)
        for action in actions:
            self._carry_out(trainer, action, now)

    def _timer(self, trainer: SimTrainer, now: float) -> None:
        """The driver's wait for `wake_at` ran out: a Tick, unless events moved the wake on."""
        trainer.timer_at = None
        if trainer.wake is None:
            return
        if now >= trainer.wake:
            self._decide(trainer, None, now)
        else:
            trainer.timer_at = trainer.wake
            self._push(trainer.wake, _TIMER, trainer, None)

    def _carry_out(self, trainer: SimTrainer, action: Action, now: float) -> None:
        if isinstance(action, Send):
            worker = self.workers[action.member]
            job = Job(trainer.index, action.attempt)
            trainer.attempts[action.attempt] = (worker, job)
            trainer.sent_requests.add(action.request)
            self.attempts += 1
            self._push(now + self.world.rtt_s / 2, _ARRIVE, worker, job)
        elif isinstance(action, Cancel):
            held = trainer.attempts.pop(action.attempt, None)
            if held is not None:
                self._push(now + self.world.rtt_s / 2, _CANCEL, *held)
        elif isinstance(action, Resolve | Fail):
            trainer.outcomes[action.request] = isinstance(action, Resolve)
            if trainer.current is not None and trainer.current[1] == action.request:
                self._settled(trainer, now)
        elif isinstance(action, Connect):
            worker = self.workers[action.member]
            took = self.world.rtt_s if worker.state == "up" else self.world.loss_s
            self._push(now + took, _HANDSHAKE, trainer, worker)
        elif isinstance(action, Disconnect):
            self._let_go(trainer, self.workers[action.member])

    def _handshake(self, trainer: SimTrainer, worker: SimWorker, now: float) -> None:
        """A Connect's outcome: `Joined` if the worker is up, else `Unreachable`."""
        if worker.state != "up":
            self.unreachable += 1
            self._decide(trainer, Unreachable(worker.name, f"{worker.name} is {worker.state}"), now)
            return
        if worker.name not in trainer.connected:
            trainer.connected.add(worker.name)
            worker.connections += 1
            self.connections_per_trainer_max = max(
                self.connections_per_trainer_max, len(trainer.connected)
            )
            self.connections_per_worker_max = max(
                self.connections_per_worker_max, worker.connections
            )
        self._decide(trainer, Joined(worker.name, self.world.limit), now)

    def _look(self, now: float) -> None:
        """Add each trainer's aperture shares to its workers' cover."""
        for trainer in self.trainers:
            for name, share in trainer.policy.aperture.items():
                self.workers[name].cover += share
        self._push(now + _LOOK_EVERY, _LOOK, None, None)

    def _let_go(self, trainer: SimTrainer, worker: SimWorker) -> None:
        """`trainer` closes its connection to `worker` (disconnected, or the worker left)."""
        if worker.name in trainer.connected:
            trainer.connected.remove(worker.name)
            worker.connections -= 1

    def _reply(self, job: Job, error: BaseException | None, now: float) -> None:
        trainer = self.trainers[job.trainer]
        if trainer.attempts.pop(job.attempt, None) is None:
            return  # cancelled: the driver no longer listens for it
        if error is None:
            event: Event = Answered(job.attempt, job.load, self.world.threads)
        else:
            event = Failed(job.attempt, error)
        self._decide(trainer, event, now)

    # The workers.

    def _arrive(self, worker: SimWorker, job: Job, now: float) -> None:
        if job.cancelled or worker.state in ("hung", "gone"):
            return
        if worker.state == "dead":
            error = WorkerError("UNAVAILABLE", f"{worker.name}: connection refused")
            self._push(now + self.world.rtt_s / 2, _REPLY, job, error)
            return
        started, refused = worker.arrive(job, now)
        if refused:
            self.refusals += 1
            error = WorkerError("RESOURCE_EXHAUSTED", f"{worker.name}: over the client's limit")
            self._push(now + self.world.rtt_s / 2, _REPLY, job, error)
        for done_at, each in started:
            self._push(done_at, _DONE, worker, each)

    def _done(self, worker: SimWorker, job: Job, now: float) -> None:
        if worker.state != "up":
            return
        for done_at, each in worker.done(job, now):
            self._push(done_at, _DONE, worker, each)
        if self._cores is not None:
            for done_at, each in self._cores.enter(job, now):
                self._push(done_at, _CPU, None, each)
        elif not job.cancelled:
            self._push(now + self.world.rtt_s / 2, _REPLY, job, None)

    def _computed(self, job: Job, now: float) -> None:
        """`job` had its share of the host's cores: its reply goes, and the next takes the core."""
        assert self._cores is not None
        for done_at, each in self._cores.leave(now):
            self._push(done_at, _CPU, None, each)
        if not job.cancelled:
            self._push(now + self.world.rtt_s / 2, _REPLY, job, None)

    def _new_worker(self, factor: float) -> SimWorker:
        name = f"w{len(self.workers)}"
        worker = SimWorker(name, self.world, factor, self._rng)
        self.workers[name] = worker
        return worker

    def _fault(self, fault: Fault, now: float) -> None:
        if fault.kind == "add":
            for _ in range(int(fault.amount)):
                self._list(self._new_worker(1.0), now)
            return
        up = [worker for worker in self.workers.values() if worker.state == "up"]
        for worker in self._rng.sample(up, min(round(fault.amount * len(up)), len(up))):
            if fault.kind == "slow":
                worker.factor *= fault.factor
            elif fault.kind == "hang":
                worker.state = "hung"
            elif fault.kind == "kill":
                worker.state = "dead"
                error = WorkerError("UNAVAILABLE", f"{worker.name}: connection lost")
                for job in worker.fail_all():
                    self.lost += 1
                    self._push(now + self.world.loss_s, _REPLY, job, error)
            else:  # remove, or rename: the same process listed under a new name
                self._remove(worker, now)
                if fault.kind == "rename":
                    self._list(self._new_worker(worker.factor), now)

    def _list(self, worker: SimWorker, now: float) -> None:
        for trainer in self.trainers:
            self._decide(trainer, Listed(worker.name), now)

    def _remove(self, worker: SimWorker, now: float) -> None:
        worker.state = "gone"
        for trainer in self.trainers:
            self._let_go(trainer, worker)
            self._decide(trainer, Left(worker.name), now)

    # The training loop: `BatchIterator.__next__` and a training step per batch.

    def _next_batch(self, trainer: SimTrainer, now: float) -> None:
        """The loop wants its next batch: fill the window, take its front, fill it again."""
        if not trainer.retrying:
            trainer.wanted_at = now
        trainer.retrying = False
        if not trainer.window and trainer.next_submit == self.world.batches:
            trainer.finished = now  # past the last batch: the loop ends
            return
        self._fill(trainer, now)
        trainer.current = current = trainer.window.popleft()
        self._fill(trainer, now)
        if trainer.current is current and current[1] in trainer.outcomes:
            self._settled(trainer, now)

    def _fill(self, trainer: SimTrainer, now: float) -> None:
        ahead = self.world.prefetch + trainer.policy.depth(now)
        while len(trainer.window) < ahead and trainer.next_submit != self.world.batches:
            request = next(trainer.requests)
            trainer.window.append((trainer.next_submit, request))
            digest = _digest(trainer.index, trainer.next_submit) if self.world.digests else b""
            self._decide(trainer, Submit(request, trainer.next_submit, digest), now)
            trainer.next_submit += 1

    def _settled(self, trainer: SimTrainer, now: float) -> None:
        """The batch the loop waits for is delivered (a training step follows) or failed (the
        loop's next `next()` retries its step after a step's time, the window withdrawn)."""
        assert trainer.current is not None
        step, request = trainer.current
        trainer.current = None
        if trainer.outcomes.pop(request):
            if now < self.world.seconds:
                trainer.stalled += now - trainer.wanted_at
                trainer.delivered += 1
                if trainer.last_batch is None:
                    trainer.first_batch = now
                else:
                    gap = now - trainer.last_batch
                    trainer.gaps.append(gap)
                    trainer.longest_gap = max(trainer.longest_gap, (gap, now))
                    if now > self._first_fault:
                        trainer.longest_after_fault = max(trainer.longest_after_fault, gap)
                trainer.last_batch = now
            self._push(now + trainer.step_s, _TAKE, trainer, None)
            return
        trainer.failures += 1
        while trainer.window:
            _, withdrawn = trainer.window.popleft()
            trainer.outcomes.pop(withdrawn, None)
            self._decide(trainer, Withdraw(withdrawn), now)
        trainer.next_submit, trainer.retrying = step, True
        self._push(now + trainer.step_s, _TAKE, trainer, None)


def _digest(trainer: int, step: int) -> bytes:
    """The request digest of `step` of `trainer`'s job (each trainer a job of its own)."""
    return hashlib.blake2b(f"{trainer}:{step}".encode(), digest_size=16).digest()
