"""Requests for the same batch meet: of members alike in load, each client's policy sends a
request to the member its digest prefers, the same for every client; load still wins."""

from __future__ import annotations

import doctest
import hashlib
from collections import Counter

import pytest

import loadax.client.affinity
from loadax.client.fleet_events import Answered, Joined, Send, Submit
from loadax.client.fleet_options import FleetOptions
from loadax.client.member_health import LATENCY_SAMPLES
from loadax.client.policy import Policy

MEMBERS = ("a", "b", "c", "d")


def digest(step: int) -> bytes:
    return hashlib.blake2b(str(step).encode(), digest_size=16).digest()


def client(limit: int = 4) -> Policy:
    policy = Policy(FleetOptions())
    for name in MEMBERS:
        policy.decide(Joined(name, limit=limit), now=0.0)
    return policy


def placed(policy: Policy, request: int, step: int, now: float = 0.0) -> Send:
    (send,) = policy.decide(Submit(request, step, digest(step)), now)
    assert isinstance(send, Send)
    return send


def test_the_affinity_examples() -> None:
    assert doctest.testmod(loadax.client.affinity).failed == 0


def test_clients_asking_for_the_same_batches_send_them_to_the_same_members() -> None:
    first, second = client(), client()
    members = Counter()
    for step in range(40):
        one, other = placed(first, step + 1, step), placed(second, step + 1, step)
        assert one.member == other.member
        members[one.member] += 1
        for policy, send in ((first, one), (second, other)):
            policy.decide(Answered(send.attempt), now=0.0)
    assert set(members) == set(MEMBERS)  # one client's requests still spread over the fleet
    assert max(members.values()) <= 20


def test_a_member_without_room_is_passed_over() -> None:
    policy = client(limit=1)
    preferred = placed(policy, 1, 0).member
    # The same batch asked again (another request) while the first is outstanding: its member
    # has no room for more of this client's requests, so another gets it.
    assert placed(policy, 2, 0).member != preferred


def test_without_affinity_requests_carry_no_digest_and_spread_by_use() -> None:
    policy = Policy(FleetOptions())
    for name in MEMBERS:
        policy.decide(Joined(name, limit=4), now=0.0)
    order = []
    for step in range(8):
        (send,) = policy.decide(Submit(step + 1, step), now=0.0)
        assert isinstance(send, Send)
        order.append(send.member)
        policy.decide(Answered(send.attempt), now=0.0)
    assert Counter(order) == Counter(dict.fromkeys(MEMBERS, 2))


def preferring(member: str, after: int) -> int:
    """The first step after `after` whose digest ranks `member` first of `MEMBERS`."""
    return next(
        step
        for step in range(after + 1, after + 1000)
        if min(MEMBERS, key=lambda name: loadax.client.affinity.affinity(digest(step), name))
        == member
    )


def test_a_slow_first_answer_does_not_send_a_digest_away_but_a_settled_slow_member_is() -> None:
    policy = client()
    now = 0.0
    sent = [policy.decide(Submit(request, 1000 + request), now)[0] for request in range(1, 5)]
    assert all(isinstance(send, Send) for send in sent)
    assert {send.member for send in sent} == set(MEMBERS)  # without digests: by load
    for send in sorted(sent, key=lambda send: send.member == "a"):
        # "a" is cold: its first answer takes 5x the others'.
        policy.decide(Answered(send.attempt), 0.08 if send.member == "a" else 0.016)
    now, step = 0.1, 0
    for request in range(5, 5 + LATENCY_SAMPLES - 1):
        step = preferring("a", step)
        send = placed(policy, request, step, now)
        assert send.member == "a"  # where every other client's request for this batch goes
        now += 0.08  # "a" stays that slow
        policy.decide(Answered(send.attempt), now)
    # Its latency settled (LATENCY_SAMPLES answers), 5x the others': load wins over affinity.
    assert placed(policy, 100, preferring("a", step), now).member != "a"


def test_affinity_is_true_false_or_auto() -> None:
    assert FleetOptions().affinity == "auto"  # a loader turns it on for replicated rows
    with pytest.raises(ValueError, match="affinity must be True, False or 'auto', got 'yes'"):
        FleetOptions(affinity="yes")  # type: ignore[arg-type]
