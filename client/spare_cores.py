"""What a remote loader measures of its training loop, batch by batch: its demand
(`loadax.client.demand`), and with `local_members("auto")` whether its own step is slowed: local
members get one more core at a time while the loop's own time between `next()` calls grows by no
more than `SLOWDOWN` of its whole step over what it was without them, and one core fewer when it
does in two windows running (Pecan's AutoPlacement, on measured loop time). A window's own step
is its median step's: a few steps that the machine's other work (or a wait for the Python lock)
delayed do not count. It rides on autotune's measurement (`loadax.execution.autotune`): the same
executor wrapper times each batch the loop waits for; only the rules differ."""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from loadax.client.demand import DemandMeter
from loadax.execution.autotune import AutotunedExecutor, Autotuner, Limits, usable_cores
from loadax.execution.executor import Executor

log = logging.getLogger("loadax.client")

SLOWDOWN = 0.05
"""How much of its whole step (its own time and its wait for the batch) local members may add to
the loop's own step..."""
NOISE_S = 0.0002
"""... beyond this much (seconds), scheduling noise: a loop whose own step is a few microseconds
(one that only takes batches) is never said to be slowed by a member."""
BASELINE = 4
"""Batches the loop's own step is first measured over, without members: soon, so that the
members start early in an epoch."""
WINDOW = 8
"""Batches measured between two later decisions."""


@dataclasses.dataclass
class SpareCores:
    """The rule: from each window's loop seconds per step, its own (`own`) and whole (`step`,
    own and waiting), how many cores local members use. The first window (none) is the baseline;
    a core that lengthens the loop's own step past it by more than `SLOWDOWN` of the whole step
    (and `NOISE_S`) in two windows running is taken back, and the count never grows past that
    again (one slowed window holds the count: it may be the machine's other work). A loop that
    mostly waits for batches can spare the cores its own step barely uses; one that never waits
    is held to 5 % of its own step. The cores come one a window, but all at once after the
    baseline when a worker on this host served it (`same_host`): they made the loop's batches
    already. With no worker on another host to make the baseline's batches, the members hold
    every core from the start (`start`) and the baseline is measured with them. Workers on this
    host keep the cores they load on (`left`, `cores_left`): the members get at most the others.

    >>> rule = SpareCores(ceiling=4)
    >>> rule.start(elsewhere=True)  # a worker on another host makes the baseline's batches
    0
    >>> [rule.decide(own, step=own) for own in (0.100, 0.101, 0.103, 0.110, 0.102, 0.110, 0.109)]
    [1, 2, 3, 3, 4, 4, 3]
    >>> waiting = SpareCores(ceiling=2)  # 0.2 ms of its own in a 100 ms step: 5 ms to spare
    >>> [waiting.decide(own, step=0.1) for own in (0.0002, 0.0006, 0.004)]
    [1, 2, 2]
    >>> beside = SpareCores(ceiling=4)  # a same-host worker made the baseline's batches
    >>> [beside.decide(own, step=own, same_host=True) for own in (0.100, 0.101, 0.110, 0.110)]
    [4, 4, 4, 3]
    >>> alone = SpareCores(ceiling=4)  # no worker elsewhere: every core, the baseline with them
    >>> alone.start(elsewhere=False), [alone.decide(own, step=own) for own in (0.100, 0.101)]
    (4, [4, 4])
    >>> sidecar = SpareCores(ceiling=4)  # a worker on this host loads on 1 of its 4 cores
    >>> sidecar.start(elsewhere=False, left=3), sidecar.decide(0.100, step=0.100, left=3)
    (3, 3)
    >>> sidecar.decide(0.100, step=0.100, left=4)  # it left: its core, one window later
    4
    """

    ceiling: int
    count: int = 0
    baseline: float | None = None
    slowed: bool = False
    """Whether the last window was slowed."""

    def start(self, elsewhere: bool, left: int | None = None) -> int:
        """The cores before the loop is measured: none while a worker on another host is there
        to make the baseline's batches (`elsewhere`), else every core that workers on this host
        leave (`left`; None: every core)."""
        self.count = 0 if elsewhere else self._most(left)
        return self.count

    def decide(
        self, own: float, step: float, same_host: bool = False, left: int | None = None
    ) -> int:
        most = self._most(left)
        self.count = min(self.count, most)  # a worker on this host came: its cores are its own
        if self.baseline is None:
            self.baseline = own
            if same_host:
                self.count = most
                return self.count
        elif own - self.baseline > SLOWDOWN * step + NOISE_S:
            if self.slowed:
                self.slowed = False
                self.count = self.ceiling = max(self.count - 1, 0)
            else:
                self.slowed = True
            return self.count
        self.slowed = False
        self.count = min(self.count + 1, most)
        return self.count

    def _most(self, left: int | None) -> int:
        return self.ceiling if left is None else min(self.ceiling, left)


class LoopTuner(Autotuner):
    """Autotune's measurements, fed to `demand` and, when there is one, to `rule`: `workers`
    is the local members it wants (from `rule.start`); `same_host()` says whether a worker on
    this host is in use (the rule's `same_host`), `left()` the cores that workers on this host
    leave now (the rule's `left`). `clock` is the loop's (a test's virtual one)."""

    def __init__(
        self,
        demand: DemandMeter,
        rule: SpareCores | None = None,
        same_host: Callable[[], bool] = lambda: False,
        left: Callable[[], int | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        ceiling = 0 if rule is None else rule.ceiling
        super().__init__(
            Limits(max_workers=ceiling, memory_bytes=0, processes=False, prefetch=False),
            workers=0 if rule is None else rule.count,
            prefetch=0,
            report=lambda tuning: None,
            clock=clock,
        )
        self.demand, self.rule, self._same_host, self._left = demand, rule, same_host, left
        self._window = threading.Lock()
        self._since: float | None = None  # the window's start, after its first batch
        self._last = 0.0  # when the loop got its last batch
        self._own: list[float] = []  # the window's steps' own seconds
        if self.workers:
            log.info(
                "local members' cores: %d from the start (no worker on another host to make "
                "the loop's batches while it is measured without them; %s)",
                self.workers,
                "every core" if left() is None else "the cores workers on this host leave",
            )

    def took(self, asked: float, got: float, batch: Any) -> None:
        self.demand.took(asked, got)
        if self.rule is None:
            return
        with self._window:
            last, self._last = self._last, got
            if self._since is None:
                self._since = got
                return
            self._own.append(asked - last)
            if len(self._own) < (WINDOW if self.rule.baseline is not None else BASELINE):
                return
            step = (got - self._since) / len(self._own)
            own = statistics.median(self._own)
            self._since, self._own = got, []
            count = self.rule.decide(own, step, self._same_host(), self._left())
            if count == self.workers:
                return
            self.workers = count
        log.info(
            "local members' cores: %d (the loop's own step %.2f ms of %.2f ms, %.2f ms at the "
            "baseline)",
            count,
            1e3 * own,
            1e3 * step,
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
    """The most cores "auto" gives local members: every core this process may use; the rule
    takes back those the loop's own step needs, as measured."""
    return usable_cores()


def cores_left(usable: int, same_host_slots: int) -> int | None:
    """The cores of `usable` that workers on this host leave the local members: those they do
    not load on (their loading slots, `same_host_slots`, told at their handshakes), or None
    (every core) when there are none, or when their slots take every core: then they share the
    trainer's cores, and are passed over while the members hold them all
    (`loadax.client.host_cores`).

    A batch of such a worker costs the host more CPU than a local member's (made in another
    process, written into this one's memory and checksummed), but it is made under a Python
    lock of its own: on R1's images on 2 cores, one member thread beside a worker of one thread
    made 6-10 % more batches a second than the local loader's 2 threads (paired medians of 10
    alternated rounds, `benchmarks/SIZING.md`), where the member on both cores beside a
    passed-over worker of 2 threads made up to 5 % fewer.

    >>> cores_left(8, same_host_slots=2), cores_left(8, 0), cores_left(2, same_host_slots=2)
    (6, None, None)
    """
    return usable - same_host_slots if 0 < same_host_slots < usable else None
