"""Subsetting: each client uses an arc of the ring of members (its aperture), on a virtual clock.
The arcs of a job's clients use every member evenly, a membership change moves few connections,
the arc grows with demand and past members that fail, and never holds more than the cap."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pipelines
import pytest
from equivalence import digests

from loadax import DataLoader
from loadax.client import RemoteDataLoader
from loadax.client.aperture import LINGER, RESHAPE_EVERY
from loadax.client.fleet_events import (
    Answered,
    Connect,
    Disconnect,
    Event,
    Failed,
    Joined,
    Listed,
    Resolve,
    Send,
    Submit,
    Tick,
    Unreachable,
)
from loadax.client.fleet_options import FleetOptions
from loadax.client.policy import TICK, Policy
from loadax.client.subset import MIN_WIDTH, Seat, aperture
from loadax.errors import WorkerError

TESTS = Path(__file__).parent


def names(count: int) -> list[str]:
    return [f"w{index:05d}" for index in range(count)]


@pytest.mark.parametrize(("members", "clients"), [(1000, 256), (100, 16), (64, 3), (10, 40)])
def test_the_arcs_of_a_jobs_clients_use_every_member_evenly(members: int, clients: int) -> None:
    ring = names(members)
    used: collections.Counter[str] = collections.Counter()
    for index in range(clients):
        seat = Seat.of(index, clients, "job")
        arc = aperture(ring, seat, seat.cover(members), lambda name: True)
        assert len(arc) <= int(seat.cover(members)) + 2
        used.update(arc)
    shares = [used[name] for name in ring]
    assert max(shares) == pytest.approx(min(shares), rel=1e-6)


def test_a_member_added_or_removed_moves_few_connections() -> None:
    ring = names(1000)
    for index in range(64):
        seat = Seat.of(index, 64, "job")
        before = set(aperture(ring, seat, 32.0, lambda name: True))
        added = set(aperture(sorted([*ring, "w00500x"]), seat, 32.0, lambda name: True))
        removed = set(aperture(ring[:1] + ring[2:], seat, 32.0, lambda name: True))
        assert len(before ^ added) <= 4
        assert len(before ^ removed) <= 4


def test_seats_are_checked() -> None:
    with pytest.raises(ValueError, match="process index 4 is not below the process count 4"):
        Seat.of(4, 4, "job")
    with pytest.raises(ValueError, match=r"position must be in \[0, 1\), got 1.5"):
        Seat(1.5)
    with pytest.raises(ValueError, match="subset"):
        FleetOptions(subset=0)


class Client:
    """A policy seated among `clients`, told of `members` listed members, on a virtual clock; it
    connects what it is asked to at once (each member takes 16), unless `unreachable`."""

    def __init__(
        self, members: int, clients: int, unreachable: frozenset[str] = frozenset(), **options: Any
    ) -> None:
        self.policy = Policy(FleetOptions(**options), Seat.of(0, clients, "job"))
        self.now = 0.0
        self.requests = 0
        self.unreachable = set(unreachable)
        self.connects: list[str] = []
        self.disconnects: list[str] = []
        self.sent: dict[int, Send] = {}  # attempt -> its send, until answered
        self.to: collections.Counter[str] = collections.Counter()  # member -> attempts sent
        self.done: set[int] = set()  # requests answered
        self.answered: collections.Counter[str] = collections.Counter()  # member -> answers
        for name in names(members):
            self.tell(Listed(name))
        self.tell(Tick())  # the arc is sized when requests come or time passes

    def tell(self, event: Event) -> None:
        pending = [event]
        while pending:
            for action in self.policy.decide(pending.pop(0), self.now):
                if isinstance(action, Connect):
                    self.connects.append(action.member)
                    refused = action.member in self.unreachable
                    joined = Joined(action.member, 16)
                    pending.append(Unreachable(action.member, "refused") if refused else joined)
                elif isinstance(action, Disconnect):
                    self.disconnects.append(action.member)
                elif isinstance(action, Send):
                    self.sent[action.attempt] = action
                    self.to[action.member] += 1
                elif isinstance(action, Resolve):
                    self.done.add(action.request)

    def run(
        self, seconds: float, outstanding: int, latency: float, broken: frozenset[str] = frozenset()
    ) -> None:
        """Keep `outstanding` requests submitted for `seconds`, each attempt answered `latency`
        after it was sent (failed, by a `broken` member), ticking every TICK."""
        end = self.now + seconds
        sent_at: dict[int, float] = {}
        while self.now < end:
            while self.requests - len(self.done) < outstanding:
                self.requests += 1
                self.tell(Submit(self.requests, self.requests))
            for attempt in self.sent:
                sent_at.setdefault(attempt, self.now)
            for attempt, when in list(sent_at.items()):
                if self.now - when >= latency:
                    del sent_at[attempt]
                    send = self.sent.pop(attempt)
                    if send.member in broken:
                        self.tell(Failed(attempt, WorkerError("UNAVAILABLE", "broken")))
                    else:
                        self.answered[send.member] += 1
                        self.tell(Answered(attempt))
            self.now += TICK
            self.tell(Tick())


def test_a_client_connects_only_its_arc_and_sends_only_to_it() -> None:
    client = Client(1000, clients=100)
    assert 10 <= len(client.connects) <= 11  # its share: 1000 / 100, and an edge member
    assert set(client.policy.members) == set(client.connects)
    client.run(2.0, outstanding=4, latency=0.05)
    assert set(client.to) <= set(client.policy.aperture)
    assert len(client.to) >= 8  # spread over the arc, not the first member


def test_a_lone_client_holds_at_most_the_cap() -> None:
    client = Client(1000, clients=1, subset=16)
    assert len(client.connects) == 16
    assert len(client.policy.aperture) == 16


def test_the_arc_grows_while_requests_wait_and_narrows_when_they_do_not() -> None:
    client = Client(1000, clients=500, in_flight_per_worker=1)  # its share: 2 members
    assert len(client.policy.aperture) <= MIN_WIDTH + 1  # before demand is known
    # Demand: 30 outstanding at once, far beyond 1 per member of a narrow arc.
    client.run(8 * RESHAPE_EVERY, outstanding=30, latency=0.2)
    wide = len(client.policy.aperture)
    assert wide >= 20
    client.run(2 * LINGER + 30 * RESHAPE_EVERY, outstanding=1, latency=0.02)
    assert len(client.policy.aperture) <= MIN_WIDTH + 1
    assert len(client.policy.members) <= MIN_WIDTH + 1  # the others went after lingering
    assert len(client.disconnects) >= wide - MIN_WIDTH - 1


def test_a_member_failing_takes_none_of_the_arc_and_the_arc_reaches_one_further() -> None:
    client = Client(100, clients=50)  # its share: 2 members
    client.run(12.0, outstanding=2, latency=0.05)  # the arc narrows to what 2 at once need
    arc = sorted(client.policy.aperture)
    victim, following = arc[1], names(100)[names(100).index(arc[-1]) + 1]
    assert following not in client.policy.members  # left when the arc narrowed
    let_go = False
    for _ in range(round(4.0 / TICK)):
        for attempt, send in list(client.sent.items()):
            if send.member == victim:
                del client.sent[attempt]
                client.tell(Failed(attempt, WorkerError("UNAVAILABLE", "gone")))
        client.run(TICK, outstanding=2, latency=0.05)
        let_go |= victim not in client.policy.members  # failing for long: kept off a while
    assert let_go
    assert following in client.policy.aperture
    assert following in client.policy.members


def test_failover_reaches_past_a_whole_arc_of_failing_members() -> None:
    client = Client(20, clients=1, subset=2)
    ring = names(20)
    start = ring.index(sorted(client.policy.members)[0])
    broken = frozenset((ring * 2)[start : start + 8])  # the arc, and 6 members on from it
    held = 0
    for _ in range(150):
        client.run(0.2, outstanding=2, latency=0.05, broken=broken)
        held = max(held, len(client.policy.members))
    assert held <= 2
    assert set(client.answered) - broken
    assert client.answered.total() >= 50


def test_a_member_that_cannot_be_connected_is_tried_again_after_a_back_off() -> None:
    refused = sorted(Client(100, clients=1, subset=4).policy.aperture)[0]
    client = Client(100, clients=1, subset=4, quarantine_initial=1.0, unreachable={refused})
    client.tell(Tick())
    assert client.connects.count(refused) == 1
    assert refused not in client.policy.aperture
    client.run(0.9, outstanding=2, latency=0.05)
    assert client.connects.count(refused) == 1
    client.unreachable.clear()
    client.run(0.6, outstanding=2, latency=0.05)
    assert client.connects.count(refused) == 2
    assert refused in client.policy.members


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_loader_of_a_subset_of_real_workers_gives_the_local_batches(transport: str) -> None:
    """6 real workers (one process), a loader that may connect 2: it never holds more, it
    connects another when one leaves, and its batches are byte for byte the local loader's."""
    command = [sys.executable, str(TESTS / "many_workers.py"), "--transport", transport]
    command += ["--count", "6"]
    pipe = subprocess.PIPE
    with subprocess.Popen(command, stdin=pipe, stdout=pipe, text=True) as server:
        try:
            assert server.stdout is not None
            targets = json.loads(server.stdout.readline())["targets"]
            pipeline = pipelines.numbers()  # as the workers serve it
            local = DataLoader(pipeline.batcher).batch_size(8).shuffle(seed=3).workers(0)
            expected = digests(local.build(pipeline.dataset))
            builder = RemoteDataLoader(targets, pipeline="numbers").subset(2)
            with builder.batch_size(8).shuffle(seed=3).build() as loader:
                first = set(loader.targets)
                held: set[int] = set()
                got = []
                for batch in loader:
                    got.append(batch)
                    held.add(len(loader.targets))
                    if len(got) == 4:  # one leaves: the arc reaches a listed worker, connected
                        loader.remove_target(sorted(first)[0])
                workers = loader.stats().workers
                last = set(loader.targets)
        finally:
            server.terminate()
    assert digests(got) == expected
    assert max(held) <= 2
    assert len(first) == 2
    assert last - first
    assert 1 <= len([name for name, worker in workers.items() if worker.requests]) <= 2
