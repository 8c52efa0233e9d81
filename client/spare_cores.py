"""What a remote loader measures of its training loop, batch by batch: its demand
(`loadax.client.demand`), and with `local_members("auto")` whether its own step is slowed: local
members are added one at a time while the loop's own time between `next()` calls stays within
`SLOWDOWN` of what it was without them, and one is removed when it does not (Pecan's
AutoPlacement, on measured loop time). It rides on autotune's measurement
(`loadax.execution.autotune`): the same executor wrapper times each batch the loop waits for;
only the rules differ."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from loadax.client.demand import DemandMeter
from loadax.execution.autotune import AutotunedExecutor, Autotuner, Limits, usable_cores
from loadax.execution.executor import Executor

log = logging.getLogger("loadax.client")

SLOWDOWN = 0.05
"""How much slower the loop's own step may get with local members than without..."""
NOISE_S = 0.0002
"""... beyond this much (seconds), scheduling noise: a loop whose own step is a few microseconds
(one that only takes batches) is never said to be slowed by a member."""
WINDOW = 16
"""Batches measured between two decisions."""


@dataclasses.dataclass
class SpareCores:
    """The rule: from each window's loop seconds per step, how many local members to run.
    The first window (no member) is the baseline; a member that slows the loop past it by more
    than `SLOWDOWN` (and `NOISE_S`) is removed and the count never grows past that again.

    >>> rule = SpareCores(ceiling=4)
    >>> [rule.decide(seconds) for seconds in (0.100, 0.101, 0.103, 0.110, 0.102, 0.101)]
    [1, 2, 3, 2, 2, 2]
    """

    ceiling: int
    count: int = 0
    baseline: float | None = None

    def decide(self, loop_seconds: float) -> int:
        if self.baseline is None:
            self.baseline = loop_seconds
        elif loop_seconds > self.baseline * (1 + SLOWDOWN) + NOISE_S:
            self.count = self.ceiling = max(self.count - 1, 0)
            return self.count
        self.count = min(self.count + 1, self.ceiling)
        return self.count


class LoopTuner(Autotuner):
    """Autotune's measurements, fed to `demand` and, when there is one, to `rule`: `workers`
    is the local members it wants."""

    def __init__(self, demand: DemandMeter, rule: SpareCores | None = None) -> None:
        ceiling = 0 if rule is None else rule.ceiling
        super().__init__(
            Limits(max_workers=ceiling, memory_bytes=0, processes=False, prefetch=False),
            workers=0,
            prefetch=0,
            report=lambda tuning: None,
        )
        self.demand, self.rule = demand, rule
        self._window = threading.Lock()
        self._since: float | None = None  # the window's start, after its first batch
        self._steps, self._waiting = 0, 0.0

    def took(self, asked: float, got: float, batch: Any) -> None:
        self.demand.took(asked, got)
        if self.rule is None:
            return
        with self._window:
            if self._since is None:
                self._since = got
                return
            self._steps += 1
            self._waiting += got - asked
            if self._steps < WINDOW:
                return
            loop_seconds = (got - self._since - self._waiting) / self._steps
            self._since, self._steps, self._waiting = got, 0, 0.0
            count = self.rule.decide(loop_seconds)
            if count == self.workers:
                return
            self.workers = count
        log.info(
            "local members: %d (the loop's own step %.2f ms, %.2f ms without them)",
            count,
            1e3 * loop_seconds,
            1e3 * (self.rule.baseline or 0.0),
        )


class LoopExecutor(AutotunedExecutor[Any]):
    """`executor`, measured by `tuner`, with the local members it wants (`resize`); its
    look-ahead is its own."""

    def __init__(
        self, executor: Executor[Any], tuner: LoopTuner, resize: Callable[[int], None]
    ) -> None:
        super().__init__(executor, tuner, resize)
        self._inner = executor

    def lookahead(self, prefetch: int) -> int:
        return self._inner.lookahead(prefetch)


def spare_cores() -> int:
    """The most local members "auto" runs: a core is left to the training loop."""
    return max(usable_cores() - 1, 1)
