"""The fleet's placement policy, rule by rule, on a virtual clock: every time is an argument, in
seconds of test time, and nothing sleeps. Each test fails if its rule is taken out."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from loadax.client.fleet_events import (
    Action,
    Answered,
    Cancel,
    Event,
    Fail,
    Failed,
    Joined,
    Left,
    Note,
    Resolve,
    Send,
    Submit,
    Tick,
    Withdraw,
)
from loadax.client.fleet_options import FleetOptions
from loadax.client.member_choice import SLOWER
from loadax.client.member_health import HUNG_STRIKES, LATENCY_SAMPLES, MemberHealth
from loadax.client.policy import TICK, Policy
from loadax.client.recorded import replay
from loadax.client.tails import EXTRA_BURST, EXTRA_SHARE, HEDGE_FACTOR, HUNG_FLOOR
from loadax.errors import PoisonedRecords, WorkerError
from loadax.wire.failures import PipelineFailed, PoisonFailed


@dataclasses.dataclass
class Fleet:
    """A policy under test, its clock, and what it decided."""

    policy: Policy
    now: float = 0.0
    log: list[tuple[float, Event, list[Action]]] = dataclasses.field(default_factory=list)
    requests: int = 0

    def tell(self, event: Event) -> list[Action]:
        actions = self.policy.decide(event, self.now)
        self.log.append((self.now, event, actions))
        return actions

    def at(self, seconds: float) -> list[Action]:
        """Move the clock to `seconds`, ticking every `TICK` on the way; every action."""
        actions: list[Action] = []
        while self.now + TICK <= seconds:
            self.now += TICK
            actions += self.tell(Tick())
        self.now = seconds
        return actions + self.tell(Tick())

    def submit(self, count: int = 1) -> list[Action]:
        actions: list[Action] = []
        for _ in range(count):
            self.requests += 1
            actions += self.tell(Submit(self.requests, self.requests - 1))
        return actions

    def answer_all(self, sends: list[Action], after: float) -> list[Action]:
        """Answer every `Send` of `sends` `after` seconds later."""
        self.now += after
        actions: list[Action] = []
        for send in sends:
            if isinstance(send, Send):
                actions += self.tell(Answered(send.attempt))
        return actions


def fleet(members: dict[str, int], **options: Any) -> Fleet:
    """A fleet of `members` (name -> announced limit) under `options`."""
    made = Fleet(Policy(FleetOptions(**options)))
    for name, limit in members.items():
        made.tell(Joined(name, limit))
    return made


def sends(actions: list[Action]) -> list[Send]:
    return [action for action in actions if isinstance(action, Send)]


def warm_up(made: Fleet, latency: float, member: str | None = None) -> None:
    """Enough answers of `latency` seconds for the fleet's p95 to be known."""
    for _ in range(LATENCY_SAMPLES):
        (send,) = sends(made.submit())
        assert member is None or send.member == member
        made.now += latency
        assert made.tell(Answered(send.attempt)) == [Resolve(send.request, send.attempt)]


def test_each_request_goes_to_the_member_expected_to_answer_first() -> None:
    made = fleet({"slow": 16, "fast": 16}, in_flight_per_worker=16)
    # Both answer once: "slow" in 1 s, "fast" in 0.1 s.
    first = sends(made.submit(2))
    assert {send.member for send in first} == {"slow", "fast"}
    for send in sorted(first, key=lambda send: send.member != "fast"):
        made.now += 0.1 if send.member == "fast" else 0.9
        made.tell(Answered(send.attempt))
    # "slow" is slower by itself than SLOWER x "fast": passed over, while "fast" takes 8.
    assert SLOWER * 0.1 < 1.0
    chosen = [send.member for send in sends(made.submit(8))]
    assert chosen == ["fast"] * 8


@pytest.mark.parametrize("b_load", [0.0, 4.0])
def test_a_member_other_clients_load_gets_fewer_requests(b_load: float) -> None:
    # Both answer in 0.1 s; "b" says other clients send it 4 requests a second per slot.
    made = fleet({"a": 16, "b": 16}, in_flight_per_worker=16)
    first = sends(made.submit(2))
    made.now += 0.1
    for send in first:
        made.tell(Answered(send.attempt, b_load if send.member == "b" else 0.0, 2))
    chosen = [send.member for send in sends(made.submit(8))]
    # Unloaded, the two take turns; "b" loaded, "a" takes each request it is alike for (as
    # soon expected to answer, within 1 + ALIKE), 3 in a row before "b" and after.
    assert chosen == (["a", "b"] * 4 if b_load == 0.0 else ["a", "a", "a", "b"] * 2)


def test_depth_is_in_flight_per_worker_within_each_announced_limit() -> None:
    made = fleet({"a": 2, "b": 16}, in_flight_per_worker=8)
    assert made.policy.depth(made.now) == 2 + 8
    sent = sends(made.submit(20))
    assert len(sent) == 10  # the others wait for answers
    assert sum(send.member == "a" for send in sent) <= 2
    # An answer lets the next request out.
    assert len(sends(made.tell(Answered(sent[0].attempt)))) == 1


def test_the_two_oldest_requests_are_hedged_at_one_and_a_half_p95() -> None:
    made = fleet({"a": 16, "b": 16})
    warm_up(made, 0.1)
    started = made.now
    first = sends(made.submit(3))
    hedge_at = started + HEDGE_FACTOR * 0.1
    assert sends(made.at(hedge_at - 2 * TICK)) == []
    hedges = sends(made.at(hedge_at + TICK))
    # The two oldest, each on the member it was not sent to; the third waits its turn.
    assert sorted(send.request for send in hedges) == [first[0].request, first[1].request]
    for hedge in hedges:
        (original,) = [send for send in first if send.request == hedge.request]
        assert hedge.member != original.member
    # The first answer wins; the other attempt is cancelled.
    actions = made.tell(Answered(hedges[0].attempt))
    (original,) = [send for send in first if send.request == hedges[0].request]
    assert actions[0] == Cancel(original.attempt)
    assert Resolve(hedges[0].request, hedges[0].attempt) in actions


def test_no_hedge_before_the_fleet_has_answered_enough() -> None:
    made = fleet({"a": 16, "b": 16})
    made.submit(2)
    assert sends(made.at(30.0)) == []  # within request_timeout, nothing is known to be late


def test_an_attempt_is_hung_at_eight_p95_but_never_under_a_second() -> None:
    made = fleet({"a": 16, "b": 16}, hedge_after=None)
    warm_up(made, 0.01)  # 8 x p95 = 0.08 s: the floor of 1 s applies
    started = made.now
    (first,) = sends(made.submit())
    assert sends(made.at(started + HUNG_FLOOR - 2 * TICK)) == []
    (again,) = sends(made.at(started + HUNG_FLOOR + TICK))
    assert (again.request, again.member) == (first.request, {"a": "b", "b": "a"}[first.member])
    # The hung attempt still wins if it answers first.
    made.now += 0.01
    actions = made.tell(Answered(first.attempt))
    assert Resolve(first.request, first.attempt) in actions
    assert Cancel(again.attempt) in actions


def test_extra_attempts_stay_within_a_tenth_of_the_requests() -> None:
    made = fleet({"a": 64, "b": 64}, in_flight_per_worker=64, hedge_after=0.1)
    warm_up(made, 0.1)
    extra = 0
    submitted = 0
    for _ in range(50):  # every request is slow: each would be hedged without the cap
        batch = sends(made.submit(4))
        submitted += 4
        later = made.at(made.now + 0.3)
        extra += len(sends(later))
        made.answer_all(batch + later, after=0.0)
    assert 0 < extra <= EXTRA_BURST + EXTRA_SHARE * submitted


def test_a_loop_held_up_by_one_slow_request_still_earns_its_hedge() -> None:
    made = fleet({"a": 64, "b": 64}, in_flight_per_worker=64, hedge_after=0.1)
    warm_up(made, 0.1)
    for _ in range(10):  # every request slow: the share of extra attempts runs out
        batch = sends(made.submit(4))
        later = sends(made.at(made.now + 0.3))
        made.answer_all(batch + later, after=0.0)
    assert later == []
    # The loop now waits for two slow requests: it admits none, yet the share accrues with
    # time at the rate requests were answered (about 13 a second here): a hedge within 1 s.
    slow = {send.request: send.member for send in sends(made.submit(2))}
    hedges = sends(made.at(made.now + 1.0))
    assert hedges
    assert all(slow[hedge.request] != hedge.member for hedge in hedges)


def test_three_hangs_in_a_row_quarantine_a_member_until_a_probe() -> None:
    made = fleet(
        {"frozen": 16, "good": 16},
        hedge_after=None,
        quarantine_initial=1.0,
        backoff_initial=5.0,
        backoff_max=5.0,
    )
    warm_up(made, 0.01)
    notes: list[Note] = []
    for strike in range(HUNG_STRIKES):
        made.now += 11.0  # latencies forgotten: the first-listed member is asked first
        (send,) = sends(made.submit())
        assert send.member == "frozen"
        actions = made.at(made.now + HUNG_FLOOR + TICK)
        notes += [action for action in actions if isinstance(action, Note)]
        (retry,) = sends(actions)
        assert retry.member == "good"
        assert made.policy.member_stats()["frozen"].failures == strike + 1
        made.tell(Answered(retry.attempt))
    assert [note.level for note in notes] == [logging.WARNING]
    assert notes[0].message.startswith("quarantined frozen: it is tried again after 1 s")
    assert made.policy.member_stats()["frozen"].quarantined is not None
    assert made.policy.depth(made.now) == 2  # only the healthy member counts
    # Kept off for its back-off even when nothing else can take a request ...
    quarantined_at = made.now - TICK
    (send,) = sends(made.submit())
    assert send.member == "good"
    assert sends(made.tell(Failed(send.attempt, WorkerError("UNAVAILABLE", "reset")))) == []
    assert sends(made.at(quarantined_at + 1.0 - TICK)) == []
    # ... then one request probes it.
    (probe,) = sends(made.at(quarantined_at + 1.0 + TICK))
    assert probe.member == "frozen"


def test_pressure_sends_a_member_less_and_counts_no_failure() -> None:
    made = fleet({"full": 16, "other": 16}, in_flight_per_worker=4, backoff_initial=0.5)
    sent = sends(made.submit(8))
    pressed = [send for send in sent if send.member == "full"]
    actions = made.tell(Failed(pressed[0].attempt, WorkerError("RESOURCE_EXHAUSTED", "full")))
    (again,) = sends(actions)
    assert again.member == "other"
    stats = made.policy.member_stats()["full"]
    assert (stats.failures, stats.quarantined) == (0, None)
    # Down for its back-off, then sent no more than it held when it pushed back.
    assert made.policy.depth(made.now) == 4
    made.at(made.now + 0.6)
    assert made.policy.depth(made.now) == 4 + len(pressed) - 1


def test_a_failed_attempt_is_reissued_at_once_and_its_member_backs_off() -> None:
    made = fleet({"a": 16, "b": 16}, backoff_initial=0.5, backoff_max=0.5)
    (send,) = sends(made.submit())
    (again,) = sends(made.tell(Failed(send.attempt, WorkerError("UNAVAILABLE", "reset"))))
    assert again.member != send.member
    assert made.policy.member_stats()[send.member].failures == 1
    made.tell(Answered(again.attempt))
    made.now += 0.4  # still backing off: everything goes to the other member
    assert {s.member for s in sends(made.submit(3))} == {again.member}


def test_a_wrong_member_is_quarantined_probed_and_released_by_an_answer() -> None:
    made = fleet({"wrong": 16, "good": 16}, quarantine_initial=2.0, in_flight_per_worker=8)
    sent = sends(made.submit(2))
    (wrong,) = [send for send in sent if send.member == "wrong"]
    error = WorkerError("FAILED_PRECONDITION", "another identity")
    actions = made.tell(Failed(wrong.attempt, error))
    assert sends(actions)[0].member == "good"
    (note,) = [action for action in actions if isinstance(action, Note)]
    assert note.facts == {"event": "quarantined", "target": "wrong", "error": str(error)}
    made.answer_all(sent + actions, after=0.01)
    made.now += 2.0
    (probe,) = sends(made.submit())  # "wrong" expects no one: it is probed
    assert probe.member == "wrong"
    # While the probe is out, the other requests keep away from it.
    assert [send.member for send in sends(made.submit(3))] == ["good"] * 3
    actions = made.tell(Answered(probe.attempt))
    assert Note(logging.INFO, "wrong answered again: out of quarantine") in actions
    assert made.policy.member_stats()["wrong"].quarantined is None


@pytest.mark.parametrize("code", ["OUT_OF_RANGE", "INVALID_ARGUMENT"])
def test_a_wrong_request_fails_at_once(code: str) -> None:
    made = fleet({"a": 16, "b": 16})
    (send,) = sends(made.submit())
    error = WorkerError(code, "no such step")
    assert made.tell(Failed(send.attempt, error)) == [Fail(send.request, error)]


def test_poison_is_asked_of_poison_retries_more_members_then_fails() -> None:
    made = fleet({"a": 16, "b": 16, "c": 16}, poison_retries=1)
    (first,) = sends(made.submit())
    poison = PoisonFailed.of("the batch of step 0", [0], [7], [0], "exited (-9)")
    (second,) = sends(made.tell(Failed(first.attempt, poison)))
    assert second.member != first.member
    actions = made.tell(Failed(second.attempt, poison))
    (fail,) = [action for action in actions if isinstance(action, Fail)]
    assert isinstance(fail.error, PoisonedRecords)
    assert sends(actions) == []  # the third member is never asked


def test_a_pipeline_failure_is_confirmed_on_one_other_member_then_raised_as_itself() -> None:
    made = fleet({"a": 16, "b": 16, "c": 16})
    (first,) = sends(made.submit())
    failed = PipelineFailed.of(ValueError("leaf ['x'] is ragged: use pad_batcher"), 0)
    (second,) = sends(made.tell(Failed(first.attempt, failed)))
    assert second.member != first.member
    actions = made.tell(Failed(second.attempt, failed))
    (fail,) = [action for action in actions if isinstance(action, Fail)]
    assert type(fail.error) is ValueError
    assert str(fail.error) == "leaf ['x'] is ragged: use pad_batcher"
    assert sends(actions) == []  # the third member is never asked
    assert all(stats.failures == 0 for stats in made.policy.member_stats().values())


def test_a_pipeline_failure_on_the_only_member_is_raised_at_once() -> None:
    made = fleet({"a": 16})
    (send,) = sends(made.submit())
    failed = PipelineFailed.of(TypeError("unsupported leaf"), 0)
    (fail,) = made.tell(Failed(send.attempt, failed))
    assert isinstance(fail, Fail)
    assert isinstance(fail.error, TypeError)


def test_a_request_fails_when_the_fleet_is_silent_for_no_worker_timeout() -> None:
    made = fleet({"a": 16}, no_worker_timeout=5.0, request_timeout=100.0)
    (send,) = sends(made.submit())
    assert made.at(5.0 - TICK) == []
    actions = made.at(5.0)
    (fail,) = [action for action in actions if isinstance(action, Fail)]
    assert isinstance(fail.error, WorkerError)
    assert fail.error.message.startswith("no worker answered for 5 s (no_worker_timeout)")
    assert "workers: a (none)" in fail.error.message
    assert Cancel(send.attempt) in actions


def test_a_dead_fleet_fails_every_request_at_once_from_its_last_answer() -> None:
    # Requests admitted after the fleet's last answer, and those waiting beyond the depth, fail
    # together at last answer + no_worker_timeout: never one timeout after another.
    made = fleet({"a": 2}, no_worker_timeout=5.0, request_timeout=100.0, in_flight_per_worker=2)
    first = sends(made.submit(2))
    made.now = 1.0
    made.tell(Answered(first[0].attempt))  # the fleet's last answer, at 1 s
    made.now = 3.0
    made.submit(3)  # one admitted at 3 s, two waiting
    assert [a for a in made.at(6.0 - TICK) if isinstance(a, Fail)] == []
    failed = [action for action in made.at(6.0) if isinstance(action, Fail)]
    assert sorted(fail.request for fail in failed) == [2, 3, 4, 5]
    assert made.at(30.0) == []  # nothing left to fail later


def test_a_request_every_member_fails_fails_every_request_when_all_are_failing() -> None:
    # Step 0 fails on "a" from 0.1 s; step 1 is answered at 1 s; step 2 is outstanding when,
    # at 5.1 s, step 0 has failed for no_worker_timeout and "a" is failing: both fail as one.
    made = fleet({"a": 16}, no_worker_timeout=5.0, backoff_max=0.1, request_timeout=100.0)
    refused = WorkerError("UNAVAILABLE", "refused")
    pending = sends(made.submit(2))
    failed: list[Fail] = []
    while not failed and made.now < 10.0:
        for send in list(pending):
            if send.request == 1 and made.now >= 0.1:
                pending += sends(made.tell(Failed(send.attempt, refused)))
            elif send.request == 2 and made.now >= 1.0:
                made.tell(Answered(send.attempt))
            else:
                continue
            pending.remove(send)
        if made.now >= 2.0 and made.requests == 2:
            pending += sends(made.submit())
        made.now += TICK
        actions = made.tell(Tick())
        pending += sends(actions)
        failed = [action for action in actions if isinstance(action, Fail)]
    assert made.now == pytest.approx(5.1, abs=3 * TICK)  # 5 s after step 0 began failing
    assert sorted(fail.request for fail in failed) == [1, 3]
    assert all("every worker failed step 0 for 5 s" in str(fail.error) for fail in failed)


def test_an_idle_fleet_is_not_silent() -> None:
    made = fleet({"a": 2}, no_worker_timeout=5.0)
    (send,) = sends(made.submit())
    made.now = 0.5
    made.tell(Answered(send.attempt))
    made.now = 100.0  # the training loop did something else for a while
    assert len(sends(made.submit())) == 1
    assert [a for a in made.at(104.0) if isinstance(a, Fail)] == []


def failing_notes(actions: list[Action]) -> list[Note]:
    return [
        action
        for action in actions
        if isinstance(action, Note) and action.message.startswith("every worker is failing")
    ]


def test_every_member_failing_is_warned_at_once_then_every_ten_seconds() -> None:
    made = fleet({"a": 16, "b": 16}, no_worker_timeout=60.0, backoff_max=0.1)
    (send,) = sends(made.submit())
    other = "b" if send.member == "a" else "a"
    (again,) = sends(made.tell(Failed(send.attempt, WorkerError("UNAVAILABLE", "refused"))))
    assert failing_notes(made.at(1.0)) == []  # one member still answers
    made.tell(Failed(again.attempt, WorkerError("UNAVAILABLE", "reset\ntraceback")))
    made.now += TICK
    actions = made.tell(Tick())
    (note,) = failing_notes(actions)
    assert note.level == logging.WARNING
    assert f"{send.member} (UNAVAILABLE: refused)" in note.message
    assert f"{other} (UNAVAILABLE: reset)" in note.message
    warned = made.now
    later: list[Action] = []
    while made.now < warned + 25.0:  # every attempt keeps failing
        for each in sends(later):
            made.tell(Failed(each.attempt, WorkerError("UNAVAILABLE", "refused")))
        made.now += TICK
        later = made.tell(Tick())
        if failing_notes(later):
            assert made.now - warned == pytest.approx(10.0, abs=2 * TICK)
            warned = made.now
    assert warned > 20.0  # warned twice more


def test_a_cold_member_hung_is_passed_over_but_never_held_against() -> None:
    made = fleet({"warm": 1}, hedge_after=None, request_timeout=30.0)
    warm_up(made, 0.01, member="warm")  # hung at the floor: 1 s
    made.tell(Joined("cold", 1))
    for cold_so_far in (True, False):
        started = made.now
        sent = {send.member: send for send in sends(made.submit(2))}
        to_warm, to_cold = sent["warm"], sent["cold"]  # each takes one at a time
        made.tell(Answered(to_warm.attempt))
        (again,) = sends(made.at(started + HUNG_FLOOR + TICK))  # passed over either way
        assert (again.request, again.member) == (to_cold.request, "warm")
        cold = made.policy.member_stats()["cold"]
        # Starting up: no failure counted, so no back-off and no strike towards quarantine.
        assert cold.failures == (0 if cold_so_far else 1)
        made.now += 0.01
        made.tell(Answered(to_cold.attempt))  # it answers after all: warm from now on
        made.tell(Answered(again.attempt))


def test_a_fleet_that_serves_another_identity_fails_every_request_at_once() -> None:
    made = fleet({"a": 16, "b": 16}, no_worker_timeout=60.0)
    sent = sends(made.submit(2))
    error = WorkerError("FAILED_PRECONDITION", "pipeline 'p' has fingerprint 1234 on this worker")
    actions = made.tell(Failed(sent[0].attempt, error))
    assert [a for a in actions if isinstance(a, Fail)] == []  # the other member still serves
    actions = made.tell(Failed(sent[1].attempt, error))
    failed = [action for action in actions if isinstance(action, Fail)]
    assert sorted(fail.request for fail in failed) == [1, 2]
    assert all(fail.error.code == "FAILED_PRECONDITION" for fail in failed)  # type: ignore[attr-defined]
    assert "the fleet now serves another" in str(failed[0].error)
    assert "fingerprint 1234" in str(failed[0].error)


def test_a_member_that_leaves_has_its_requests_reissued() -> None:
    made = fleet({"a": 16, "b": 16})
    sent = sends(made.submit(2))
    (gone,) = [send for send in sent if send.member == "a"]
    (again,) = sends(made.tell(Left("a")))
    assert (again.request, again.member) == (gone.request, "b")
    assert made.tell(Answered(gone.attempt)) == []  # a late answer of a member gone


def test_a_withdrawn_request_cancels_its_attempt() -> None:
    made = fleet({"a": 16})
    (send,) = sends(made.submit())
    assert made.tell(Withdraw(send.request)) == [Cancel(send.attempt)]
    assert made.policy.wake_at(made.now) is None


def test_a_recorded_run_replays_to_the_same_decisions() -> None:
    made = fleet({"a": 4, "b": 4, "c": 4}, poison_retries=1)
    warm_up(made, 0.05)
    outstanding: list[Send] = []
    for round_ in range(20):
        outstanding += sends(made.submit(6))
        if round_ % 5 == 0:
            failed = outstanding.pop(0)
            error = WorkerError("UNAVAILABLE", "reset")
            outstanding += sends(made.tell(Failed(failed.attempt, error)))
        outstanding += sends(made.at(made.now + 0.2))
        made.now += 0.01
        answering, outstanding = outstanding, []
        for send in answering:
            outstanding += sends(made.tell(Answered(send.attempt)))
    decided = [repr(actions) for _, _, actions in made.log]
    again = [repr(actions) for actions in replay(made.policy.options, made.log)]
    assert again == decided
    assert sum(len(actions) for _, _, actions in made.log) > 100


def test_an_attempt_sent_while_its_member_was_cold_is_not_held_against_it() -> None:
    # A worker whose loader processes start one by one answers its first attempt before the
    # second one sent with it: given up as hung, that second one does not count as a failure.
    member = MemberHealth("w", 2, FleetOptions())
    member.send(1, now=0.0)
    member.send(2, now=0.0)
    assert not member.warm_at(0.0)
    member.answered(1, now=2.0)
    assert not member.warm_at(0.0)  # attempt 2 was sent cold
    assert member.warm_at(2.5)  # one sent after its first answer is held against it
    member.answered(2, now=3.0)
    assert member.warm_since == 2.0  # its first answer, not its latest


def test_a_request_is_admitted_at_once_only_while_fewer_than_the_depth_are_out() -> None:
    made = fleet({"a": 1})
    assert made.policy.admits(made.now)
    (first,) = sends(made.submit())
    assert not made.policy.admits(made.now)
    assert made.submit() == []  # it waits for an answer
    (second,) = sends(made.tell(Answered(first.attempt)))
    assert not made.policy.admits(made.now)
    made.tell(Answered(second.attempt))
    assert made.policy.admits(made.now)


def test_the_next_tick_is_wanted_at_the_first_deadline_or_at_the_pace_while_one_fails() -> None:
    made = fleet({"a": 16, "b": 16})
    warm_up(made, 0.1)
    assert made.policy.wake_at(made.now) is None  # nothing outstanding
    started = made.now
    first = sends(made.submit(2))
    hedge_at = started + HEDGE_FACTOR * 0.1  # the two oldest requests' hedges
    assert made.policy.wake_at(made.now) == pytest.approx(hedge_at)
    made.now += 0.05
    (again,) = sends(made.tell(Answered(first[0].attempt)) + made.submit())
    # The newest attempt's hedge is later than the older one's: answers never put one off.
    assert made.policy.wake_at(made.now) == pytest.approx(hedge_at)
    made.now = hedge_at
    hedges = sends(made.tell(Tick()))
    assert [hedge.request for hedge in hedges] == [first[1].request]
    next_hedge = started + 0.05 + HEDGE_FACTOR * 0.1  # of the request sent after the answer
    assert made.policy.wake_at(made.now) == pytest.approx(next_hedge)
    # A member failing: a TICK after the last tick, and so on (it backs off, is warned of).
    made.tell(Failed(again.attempt, WorkerError("UNAVAILABLE", "reset")))
    assert made.policy.wake_at(made.now) == pytest.approx(made.now + TICK)
