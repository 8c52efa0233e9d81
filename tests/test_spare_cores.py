"""The rule of `local_members("auto")` (`loadax.client.spare_cores`): how many of the trainer's
cores its local members get, from the loop's measured steps."""

from __future__ import annotations

from loadax.client.demand import DemandMeter
from loadax.client.spare_cores import BASELINE, WINDOW, LoopTuner, SpareCores


def test_a_loop_that_mostly_waits_keeps_its_members_though_its_own_step_grows() -> None:
    # R1's loop: 0.2 ms of its own in a 120 ms step; members on the same cores make it 0.6 ms.
    rule = SpareCores(ceiling=2)
    assert [rule.decide(own, step=0.120) for own in (0.0002, 0.0006, 0.0006, 0.0045)] == [
        1,
        2,
        2,
        2,
    ]
    # 8 ms more of its own is more than 5 % of its step: a core back, and never again.
    assert [rule.decide(own, step=0.120) for own in (0.0082, 0.0002)] == [1, 1]


def test_a_loop_that_never_waits_gives_a_core_back_when_its_step_slows_by_5_percent() -> None:
    rule = SpareCores(ceiling=4)
    decided = [rule.decide(own, step=own) for own in (0.100, 0.101, 0.104, 0.106, 0.100)]
    assert decided == [1, 2, 3, 2, 2]
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
    for _ in range(WINDOW):  # 20 ms of its own in each 100 ms step: slowed
        asked, now = now + 0.02, now + 0.1
        tuner.took(asked, now, batch=None)
    assert tuner.workers == 3
