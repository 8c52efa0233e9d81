"""A worker on the trainer's host beside local members (`loadax.client.host_cores`): passed over
while the local members hold every usable core and can take requests, the fallback otherwise;
the batches are the local loader's whatever served them. The rule on the policy's virtual clock,
then with a real worker process and `local_members("auto")`."""

from __future__ import annotations

import contextlib
import doctest
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import local_member_pipelines
import pytest
from equivalence import forms, through_codec
from workers import pinned

from loadax import DataLoader, Pipeline
from loadax.client import RemoteDataLoader, host_cores, local_members, remote_loader, spare_cores
from loadax.client.fleet_events import (
    Answered,
    Event,
    Failed,
    Joined,
    Left,
    LocalCores,
    Send,
    Tick,
)
from loadax.client.fleet_events import Submit as Asked
from loadax.client.fleet_options import FleetOptions
from loadax.client.policy import Policy
from loadax.client.spare_cores import BASELINE, WINDOW
from loadax.errors import WorkerError
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire.failures import PipelineFailed

WORKER, LOCAL = "zmq://127.0.0.1:5555", "local 0"


class Host:
    """A policy with a same-host worker and one local member that takes 2 requests at once."""

    def __init__(self, cores: int, usable: int, options: FleetOptions | None = None) -> None:
        self.policy, self.now, self._requests = Policy(options or FleetOptions()), 0.0, 0
        self.tell(Joined(WORKER, limit=4, same_host=True))
        self.tell(Joined(LOCAL, limit=2))
        self.tell(LocalCores(cores, usable))

    def tell(self, event: Event) -> list[Send]:
        self.now += 0.001
        return [
            action for action in self.policy.decide(event, self.now) if isinstance(action, Send)
        ]

    def ask(self, count: int) -> list[Send]:
        sends = []
        for _ in range(count):
            self._requests += 1
            sends += self.tell(Asked(self._requests, step=self._requests))
        return sends


def test_the_policy_passes_over_a_same_host_worker_only_while_local_members_hold_every_core() -> (
    None
):
    held = Host(cores=2, usable=2)
    sends = held.ask(6)
    assert [send.member for send in sends] == [LOCAL, LOCAL]  # the depth is the member's alone
    assert held.policy.depth(held.now) == 2
    # It answers: the next waiting request goes to it, never to the worker.
    assert [send.member for send in held.tell(Answered(sends[0].attempt))] == [LOCAL]
    # It fails an attempt and backs off: the worker is its fallback at once.
    failed = held.tell(Failed(sends[1].attempt, WorkerError("UNAVAILABLE", "reset")))
    assert {send.member for send in failed} == {WORKER}
    # A core given back (e.g. for a slowed loop): both share the load.
    fewer = Host(cores=1, usable=2)
    assert {send.member for send in fewer.ask(6)} == {LOCAL, WORKER}
    # The local member gone: the worker serves.
    gone = Host(cores=2, usable=2)
    gone.tell(Left(LOCAL))
    assert {send.member for send in gone.ask(2)} == {WORKER}


def test_a_request_only_the_passed_over_worker_can_take_goes_to_it() -> None:
    held = Host(cores=2, usable=2)
    (send,) = held.ask(1)
    failed = PipelineFailed.of(ValueError("ragged"), 1)  # confirmed by another member, if any
    assert [again.member for again in held.tell(Failed(send.attempt, failed))] == [WORKER]


def test_a_hedge_is_never_sent_to_the_passed_over_worker_but_a_hung_attempt_is() -> None:
    # A hedge bets that another member is faster: not on the cores the local member uses.
    held = Host(cores=2, usable=2, options=FleetOptions(hedge_after=0.05, request_timeout=1.0))
    (send,) = held.ask(1)
    assert send.member == LOCAL
    held.now += 0.5  # ten times the hedge's age
    assert held.tell(Tick()) == []
    held.now += 1.0  # past request_timeout: given up as hung, so the worker takes it
    assert [again.member for again in held.tell(Tick())] == [WORKER]


def test_the_examples_of_the_rules_run() -> None:
    for module in (host_cores, spare_cores):
        failed, tried = doctest.testmod(module)
        assert tried > 0, module.__name__
        assert failed == 0, module.__name__


RECORDS, BATCH, SEED, COST_MS = 128, 4, 3, 3.0
SLOWED_S = 0.01
BACK_WITHIN_S = 40.0
"""A restarted worker answers again after its back-off (at most 4 s by default) and a restart
(about 1 s): ample room on a loaded machine."""
"""The loop's own step while the local members hold the core: far more than 5 % of its step."""


class Cores(logging.Handler):
    """The cores `local_members("auto")` chose, each with the batches the loop had then, and
    what was logged of the same-host worker."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.taken = 0
        self.chosen: list[tuple[int, int]] = []
        self.same_host: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(getattr(record, "event", "")).startswith("same_host"):
            self.same_host.append(record.event)  # type: ignore[attr-defined]
        message = record.getMessage()
        if message.startswith("local members' cores: "):
            cores = int(message.removeprefix("local members' cores: ").split(" ")[0])
            self.chosen.append((cores, self.taken))


@contextlib.contextmanager
def chosen_cores(
    usable: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[Cores]:
    """What "auto" chooses while the block runs, with `usable` cores (whatever this host has)."""
    for module in (remote_loader, local_members):
        monkeypatch.setattr(module, "spare_cores", lambda: usable)
    cores = Cores()
    logger = logging.getLogger("loadax.client")
    logger.addHandler(cores)
    caplog.set_level(logging.INFO, logger="loadax.client")
    try:
        yield cores
    finally:
        logger.removeHandler(cores)


@contextlib.contextmanager
def same_host_worker(threads: int) -> Iterator[str]:
    """The address of a worker on loopback, in this process (on this host, found at the
    handshake), loading on `threads` threads."""
    worker = Worker({"noisy": local_member_pipelines.sleepy(RECORDS, COST_MS)}, threads=threads)
    server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=threads)
    try:
        yield server.start().replace("tcp://", "zmq://", 1)
    finally:
        server.stop(grace=0)
        worker.close()


def auto(target: str, pipeline: Pipeline[Any, Any]) -> RemoteDataLoader:
    """A loader of `target` with `local_members("auto")` running `pipeline`."""
    return (
        RemoteDataLoader([target], pipeline="noisy")
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .local_members("auto", pipeline=pipeline)
    )


def test_auto_passes_over_a_same_host_worker_until_the_slowed_loop_gives_the_core_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = local_member_pipelines.sleepy(RECORDS, COST_MS)
    got, asked = [], []  # the batches, and the worker's requests after each
    with chosen_cores(1, monkeypatch, caplog) as cores, same_host_worker(threads=2) as address:
        # Its 2 threads take the one usable core: it shares the trainer's.
        slowed = auto(address, pipeline).hedge_after(10)  # no hedge while it is passed over
        with slowed.build() as loader:
            for batch in loader:
                got.append(batch)
                cores.taken += 1
                asked.append(loader.stats().workers[address].requests)
                # Once the baseline is measured (the start-up batch and BASELINE more), the
                # loop's own work is slowed while the member holds the core.
                if cores.taken > BASELINE and [count for count, _ in cores.chosen] == [1]:
                    time.sleep(SLOWED_S)
    assert [count for count, _ in cores.chosen] == [1, 0], cores.chosen
    assert cores.same_host == ["same_host_passed_over", "same_host_used"]
    (_, given), (_, back) = cores.chosen
    # The core was given from the start (no worker elsewhere to measure the loop without it):
    # until it was taken back, after two slowed windows, no request went to the worker; then
    # the worker served again.
    assert given == 0, cores.chosen
    assert back >= BASELINE + 2 * WINDOW, cores.chosen
    assert asked[back - 1] == 0, (cores.chosen, asked)
    assert asked[-1] > asked[back]
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED)
    assert forms(got) == forms(through_codec(local.build(pipeline.dataset)))


def test_auto_leaves_a_same_host_worker_its_own_cores_and_uses_it_beside_the_members(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = local_member_pipelines.sleepy(RECORDS, COST_MS)
    got = []
    # It loads on 1 thread, says so at its handshake, and keeps that core.
    with (
        chosen_cores(2, monkeypatch, caplog) as cores,
        same_host_worker(threads=1) as address,
        auto(address, pipeline).build() as loader,
    ):
        for batch in loader:
            got.append(batch)
            cores.taken += 1
        served = {name: stats.requests for name, stats in loader.stats().workers.items()}
    assert cores.chosen == [(1, 0)], cores.chosen  # from the start, and never more
    assert cores.same_host == []  # never passed over: the members never hold both cores
    assert served[address] > 0, served
    assert served[LOCAL] > 0, served
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED)
    assert forms(got) == forms(through_codec(local.build(pipeline.dataset)))


def test_a_same_host_workers_cores_go_to_the_members_while_it_is_down_and_back_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    records, killed_at, deadline = 400, 12, time.monotonic() + BACK_WITHIN_S
    served = (
        "[pipelines.noisy]\n"
        'factory = "local_member_pipelines:sleepy"\n'
        f"args = {{ records = {records}, cost_ms = {COST_MS} }}\n"
    )
    pipeline = local_member_pipelines.sleepy(records, COST_MS)
    got, restarted_at = [], 0
    with chosen_cores(2, monkeypatch, caplog) as cores, pinned(tmp_path, "zmq", threads=1) as fleet:
        target = fleet.start(served)
        with auto(target, pipeline).num_epochs(None).build() as loader:
            for batch in loader:
                got.append(batch)
                cores.taken += 1
                chosen = [count for count, _ in cores.chosen]
                if cores.taken == killed_at:
                    fleet.running[0].process.kill()  # kill -9: its requests fail
                elif not restarted_at and chosen == [1, 2]:
                    fleet.restart(0, served)  # on its port: it answers again
                    restarted_at = cores.taken
                if len(chosen) > 2 or time.monotonic() > deadline:
                    break
    # One core from the start (the worker said it loads on the other); both once it failed, at
    # the loop's next decision (a window of WINDOW batches); one again once it answers (after
    # its back-off, at most `backoff_max` or `quarantine_max`, and a window).
    assert [count for count, _ in cores.chosen] == [1, 2, 1], cores.chosen
    (_, first), (_, down), (_, back) = cores.chosen
    assert first == 0, cores.chosen
    assert killed_at <= down <= killed_at + 3 * WINDOW, cores.chosen
    assert back > restarted_at > 0, (cores.chosen, restarted_at)
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).num_epochs(None)
    expected = iter(local.build(pipeline.dataset))
    assert forms(got) == forms(through_codec([next(expected) for _ in got]))
