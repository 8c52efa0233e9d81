"""The rule of `local_members("auto")` (`loadax.client.spare_cores`): how many of the trainer's
cores its local members get, from the loop's measured steps."""

from __future__ import annotations

import pytest

from loadax.client.demand import DemandMeter
from loadax.client.spare_cores import BASELINE, WINDOW, LoopTuner, SpareCores, cores_left


def test_a_loop_that_mostly_waits_keeps_its_members_though_its_own_step_grows() -> None:
    # R1's loop: 0.2 ms of its own in a 120 ms step; members on the same cores make it 0.6 ms.
    rule = SpareCores(ceiling=2)
    assert [rule.decide(own, step=0.120) for own in (0.0002, 0.0006, 0.0006, 0.0045)] == [
        1,
        2,
        2,
        2,
    ]
    # 8 ms more of its own is more than 5 % of its step: in two windows running, a core back,
    # and never again.
    assert [rule.decide(own, step=0.120) for own in (0.0082, 0.0082, 0.0002)] == [2, 1, 1]


def test_a_loop_that_never_waits_gives_a_core_back_when_its_step_slows_by_5_percent() -> None:
    rule = SpareCores(ceiling=4)
    decided = [rule.decide(own, step=own) for own in (0.100, 0.101, 0.104, 0.106, 0.106, 0.100)]
    assert decided == [1, 2, 3, 3, 2, 2]
    assert rule.ceiling == 2


def test_one_slowed_window_holds_the_cores_and_two_running_take_one_back() -> None:
    rule = SpareCores(ceiling=3)
    # Slowed once, then not: the machine's other work, say. The count holds, then grows.
    assert [rule.decide(own, step=own) for own in (0.100, 0.101, 0.110, 0.101)] == [1, 2, 2, 3]
    # Slowed, not, slowed: never two running, never a core back.
    assert [rule.decide(own, step=own) for own in (0.110, 0.101, 0.110, 0.101)] == [3, 3, 3, 3]
    assert [rule.decide(own, step=own) for own in (0.110, 0.110)] == [3, 2]
    assert rule.ceiling == 2


def test_the_first_core_is_given_after_a_short_baseline_then_one_a_window() -> None:
    tuner = LoopTuner(DemandMeter(), SpareCores(ceiling=2))
    now, chosen = 0.0, []
    for _ in range(1 + BASELINE + WINDOW):  # the first batch is the loader's start-up
        asked, now = now + 0.0002, now + 0.1  # 0.2 ms of the loop's own, then it waits
        tuner.took(asked, now, batch=None)
        chosen.append(tuner.workers)
    assert chosen.index(1) == BASELINE  # the loop's (BASELINE + 1)-th batch
    assert chosen[-1] == 2


def test_a_same_host_workers_cores_are_given_at_once_after_the_baseline() -> None:
    # Its cores are the trainer's and made the baseline's batches: the local members take them
    # all at once (and it is passed over), then give one back if the loop's own step slows.
    tuner = LoopTuner(DemandMeter(), SpareCores(ceiling=4), same_host=lambda: True)
    now, chosen = 0.0, []
    for _ in range(1 + BASELINE):
        asked, now = now + 0.0002, now + 0.1
        tuner.took(asked, now, batch=None)
        chosen.append(tuner.workers)
    assert chosen[-2:] == [0, 4]
    for _ in range(2 * WINDOW):  # 20 ms of its own in each 100 ms step: slowed, twice running
        asked, now = now + 0.02, now + 0.1
        tuner.took(asked, now, batch=None)
    assert tuner.workers == 3


def loop(tuner: LoopTuner, owns: list[float], now: float = 0.0, step: float = 0.1) -> float:
    """The loop's steps on a virtual clock: each of `step` seconds, `own` of them its own."""
    for own in owns:
        tuner.took(asked=now + own, got=now + step, batch=None)
        now += step
    return now


def test_a_window_is_judged_by_its_median_step_so_a_few_delayed_steps_do_not_count() -> None:
    tuner = LoopTuner(DemandMeter(), SpareCores(ceiling=3))
    now = loop(tuner, [0.0002] * (1 + BASELINE))  # the start-up batch, then the baseline
    assert tuner.workers == 1
    # 3 of 8 steps delayed 30 ms (their mean is 11 ms: slowed), the median 0.2 ms: not slowed.
    delayed = [0.0002, 0.03, 0.0002, 0.03, 0.0002, 0.0002, 0.03, 0.0002]
    now = loop(tuner, delayed, now)
    now = loop(tuner, delayed, now)
    assert tuner.workers == 3
    # Most steps slowed, in two windows running: one back.
    slowed = [0.02] * 5 + [0.0002] * 3
    loop(tuner, slowed * 2, now)
    assert tuner.workers == 2


def test_with_no_worker_elsewhere_every_core_is_given_from_the_start() -> None:
    # No worker on another host can make the batches while the loop is measured without
    # members (none, or only workers on this host): the baseline is measured with them.
    rule = SpareCores(ceiling=2)
    assert rule.start(elsewhere=False) == 2
    tuner = LoopTuner(DemandMeter(), rule)
    assert tuner.workers == 2
    now = loop(tuner, [0.0002] * (1 + BASELINE + WINDOW))
    assert tuner.workers == 2
    assert rule.baseline == pytest.approx(0.0002)
    loop(tuner, [0.02] * (2 * WINDOW), now)  # slowed against that baseline: one back
    assert tuner.workers == 1


def test_members_get_the_cores_a_same_host_worker_leaves_and_take_them_back_when_it_leaves() -> (
    None
):
    # A worker on this host loads on 1 of its 4 cores (its loading slots, told at its handshake):
    # the members hold the other 3 from the start, and the loop is measured with them.
    left: list[int | None] = [3]
    rule = SpareCores(ceiling=4)
    assert rule.start(elsewhere=False, left=left[-1]) == 3
    tuner = LoopTuner(DemandMeter(), rule, same_host=lambda: True, left=lambda: left[-1])
    now = loop(tuner, [0.0002] * (1 + BASELINE + WINDOW))
    assert tuner.workers == 3  # never past what it leaves, though the loop is not slowed
    left.append(None)  # it left (or went down for good): its core, one window later
    now = loop(tuner, [0.0002] * WINDOW, now)
    assert tuner.workers == 4
    left.append(2)  # a worker of 2 slots came: its cores are its own at the next decision
    loop(tuner, [0.0002] * WINDOW, now)
    assert tuner.workers == 2
    assert rule.ceiling == 4  # the rule's own ceiling is lowered by a slowed loop only


def test_cores_left_counts_only_workers_that_leave_some() -> None:
    assert cores_left(8, same_host_slots=3) == 5
    assert cores_left(8, same_host_slots=0) is None  # none on this host, or none told
    # Their slots take every core: they share the trainer's, which the members take (and the
    # policy passes them over while they hold them all, `loadax.client.host_cores`).
    assert cores_left(2, same_host_slots=2) is None
    assert cores_left(2, same_host_slots=8) is None
