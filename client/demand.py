"""The demand signal a fleet is sized from: how fast the training loop would take batches if never
kept waiting, how much of its recent time it waited, and `workers_wanted`, the remote workers
that would keep that wait under a target with one to spare (`RemoteLoader.stats()`).

A member's capacity is what it delivers while busy, not what it delivered: by Little's law,
the requests it held over the time they took (`MemberRates`), so that a fleet larger than needed,
whose members idle part of the time, is not mistaken for a slow one. This is exact for a worker
that splits each batch over its threads (a worker's default) or makes one at a time; a worker
whose processes each make a whole batch at once is under-rated while this loader keeps fewer
requests at it than it has processes. Local members' capacity comes off the demand first: the
trainer's own cores are used before workers are asked for.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Mapping

from loadax.client.fleet_watch import is_local

DEFAULT_STALL_TARGET = 0.02
"""The share of its time the training loop may wait for batches, by default."""
DEFAULT_WINDOW_S = 10.0
"""Seconds of the recent past the demand and the stall are measured over, by default."""
RATE_ANSWERS = 32
"""Per member, its most recent answers make its rate."""


def workers_wanted(
    demand: float, capacities: Mapping[str, float], stall_target: float = DEFAULT_STALL_TARGET
) -> int | None:
    """The remote workers, each delivering what the remote members do on average, that with the
    local members' capacity keep a loop of `demand` batches per second waiting under
    `stall_target` of its time, plus one for a failure (0 when local members suffice); None
    before a remote member has answered.

    >>> workers_wanted(100.0, {"grpc://a": 40.0, "grpc://b": 40.0})
    4
    >>> workers_wanted(100.0, {"grpc://a": 40.0, "local 0": 30.0})
    3
    >>> workers_wanted(20.0, {"grpc://a": 40.0, "local 0": 30.0})
    0
    """
    remote = [rate for name, rate in capacities.items() if not is_local(name)]
    if not remote:
        return None
    local = sum(rate for name, rate in capacities.items() if is_local(name))
    # A loop that waits w of its time takes (1 - w) of the batches it would: that many suffice.
    needed = max(demand * (1 - stall_target) - local, 0.0) / (sum(remote) / len(remote))
    workers = math.ceil(needed - 1e-9)
    return workers + 1 if workers else 0


class MemberRates:
    """Each member's batches per second while busy: of its `RATE_ANSWERS` most recent answers,
    the requests it held when each was sent, over the seconds they took (Little's law).
    Written by the driver's thread, read by any.

    >>> rates = MemberRates()
    >>> rates.sent("a", attempt=1, now=0.0); rates.sent("a", attempt=2, now=0.0)
    >>> rates.answered(1, now=0.25), rates.answered(2, now=0.5)
    ('a', 'a')
    >>> rates.capacities()  # (1 + 2) requests held over (0.25 + 0.5) s
    {'a': 4.0}
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[int, tuple[str, float]] = {}  # attempt -> (member, when)
        self._held: dict[str, int] = {}  # member -> attempts outstanding
        self._samples: dict[str, deque[tuple[int, float]]] = {}  # (held, seconds) per answer
        self._pending: dict[int, int] = {}  # attempt -> requests its member held at its sending

    def sent(self, member: str, attempt: int, now: float) -> None:
        with self._lock:
            held = self._held[member] = self._held.get(member, 0) + 1
            self._sent[attempt], self._pending[attempt] = (member, now), held

    def answered(self, attempt: int, now: float) -> str | None:
        """The member that answered `attempt` (None: not sent, or dropped)."""
        with self._lock:
            member, held, sent_at = self._end(attempt)
            if member is not None:
                samples = self._samples.setdefault(member, deque(maxlen=RATE_ANSWERS))
                samples.append((held, now - sent_at))
            return member

    def dropped(self, attempt: int) -> str | None:
        """`attempt` failed or was cancelled: its member (None: not sent)."""
        with self._lock:
            return self._end(attempt)[0]

    def left(self, member: str) -> None:
        with self._lock:
            self._samples.pop(member, None)

    def capacities(self) -> dict[str, float]:
        with self._lock:
            return {
                member: sum(held for held, _ in samples) / seconds
                for member, samples in self._samples.items()
                if (seconds := sum(took for _, took in samples)) > 0
            }

    def _end(self, attempt: int) -> tuple[str | None, int, float]:
        """`attempt`'s member, the requests it held at its sending and when (None, 0, 0.0: not
        sent); it holds one fewer now."""
        sent = self._sent.pop(attempt, None)
        held = self._pending.pop(attempt, 0)
        if sent is None:
            return None, 0, 0.0
        member, sent_at = sent
        self._held[member] -= 1
        return member, held, sent_at


@dataclasses.dataclass(frozen=True, slots=True)
class Demand:
    """The loop's recent numbers: `stall` (the share of the time it waited), `demand` (batches
    per second it would take if never kept waiting, 0 before its first) and `workers_wanted`."""

    stall: float
    demand: float
    workers_wanted: int | None


class DemandMeter:
    """The loop's demand over the last `window` seconds, from each batch it took: when it asked
    (`asked`, the end of its own step) and got it (`got`); `stall_target` for `workers_wanted`.

    >>> meter = DemandMeter(window=10.0)
    >>> for step in range(10):  # the loop's own step is 0.1 s, then it waits 0.1 s
    ...     meter.took(asked=0.2 * step + 0.1, got=0.2 * step + 0.2)
    >>> demand = meter.measure({"grpc://a": 4.0}, now=2.0)
    >>> round(demand.stall, 3), round(demand.demand, 3), demand.workers_wanted
    (0.5, 10.0, 4)
    """

    def __init__(
        self, stall_target: float = DEFAULT_STALL_TARGET, window: float = DEFAULT_WINDOW_S
    ) -> None:
        self.stall_target, self.window = stall_target, window
        self._lock = threading.Lock()
        self._steps: deque[tuple[float, float, float]] = deque()  # (got, own step, waited)
        self._last: float | None = None  # when the loop last got a batch

    def took(self, asked: float, got: float) -> None:
        """The loop asked for a batch at `asked` and got it at `got`."""
        with self._lock:
            if self._last is not None:  # the first batch's step is the loader's start-up
                self._steps.append((got, max(asked - self._last, 0.0), got - asked))
            self._last = got
            self._forget(got)

    def measure(self, capacities: Mapping[str, float], now: float) -> Demand:
        """The demand of the steps the loop ended in the window before `now`, with the members'
        capacities (batches per second)."""
        with self._lock:
            self._forget(now)
            own = sum(step for _, step, _ in self._steps)
            waited = sum(wait for _, _, wait in self._steps)
            steps = len(self._steps)
        demand = steps / own if steps and own > 0 else 0.0
        stall = waited / (own + waited) if own + waited > 0 else 0.0
        wanted = workers_wanted(demand, capacities, self.stall_target) if demand else None
        return Demand(stall, demand, wanted)

    def _forget(self, now: float) -> None:
        while self._steps and self._steps[0][0] < now - self.window:
            self._steps.popleft()
