"""How the policy judges members: each member's latency, load, back-off and quarantine
(`MemberHealth`) and the fleet's recent latency (`FleetLatency`). Pure state: time comes in as
`now`."""

from __future__ import annotations

from collections import deque

from loadax.client.fleet_options import FleetOptions
from loadax.client.fleet_stats import MemberCounts
from loadax.iterators.stats import WorkerStats
from loadax.wire.load import DecayingRate

HUNG_STRIKES = 3
"""A member whose attempts are given up this many times in a row is quarantined."""
LATENCY_SAMPLES = 4
"""Answers the fleet must have given before its latency sets hedges and hang deadlines (until
then an attempt may take `request_timeout` and no request is hedged)."""
_RECENT = 256  # the fleet's answers whose latencies make its p95
_EWMA_WEIGHT = 0.2  # of a member's newest answer in its latency estimate
_STALE_AFTER = 10.0  # seconds without an answer after which a member's latency is forgotten


class MemberHealth:
    """One member as the policy sees it: its attempts outstanding, recent latency, how many
    requests it takes now, and whether it is backing off or quarantined; `same_host`: a worker
    on the trainer's host; `slots`: the batches it loads at once, as its handshake said (0: it
    did not say; its replies say it again)."""

    def __init__(
        self,
        name: str,
        announced: int,
        options: FleetOptions,
        same_host: bool = False,
        slots: int = 0,
    ) -> None:
        self.name, self.announced, self._options = name, announced, options
        self.same_host, self.slots = same_host, slots
        self.limit = announced  # lowered by back-pressure, regrown by answers
        self.sent: dict[int, float] = {}  # attempt -> when
        self.latency: float | None = None  # EWMA of its answers, raised by abandoned attempts
        self.latency_at = 0.0
        self.down_until = 0.0
        self.failures = 0  # in a row, since its last answer
        self.hangs = 0  # attempts given up as hung, in a row
        self.quarantines = 0  # in a row, since its last answer
        self.quarantined: str | None = None  # why, until it answers again
        self.wrong = False  # quarantined for serving another pipeline identity
        self.failing = False  # its last attempt failed (back-pressure aside) or hung
        self.answers = 0
        self.warm_since: float | None = None  # when it first answered (`warm_at`)
        self.last_error = "none"
        self.counts = MemberCounts()
        self._sending = DecayingRate()  # this client's requests to it
        self._others = 0.0  # the other clients' load on it, as it last said
        self._slots = max(slots, 1)

    def stats(self) -> WorkerStats:
        return self.counts.stats(self.quarantined)

    def free(self, now: float) -> bool:
        """Whether it may be sent an attempt now: not kept off, and with room."""
        return self.down_until <= now and len(self.sent) < self.limit

    def fresh_latency(self, now: float) -> float | None:
        """Its recent latency; None when it has none or it is stale."""
        if self.latency is not None and now - self.latency_at <= _STALE_AFTER:
            return self.latency
        return None

    def expected_latency(self, now: float, typical: float, own: bool = True) -> float:
        """Its recent latency (`typical` without one, or when not `own`), but at least the age
        of its oldest attempt outstanding: a member slow to answer is known to be slow before
        it answers."""
        latency = self.fresh_latency(now) if own else None
        latency = typical if latency is None else latency
        return max(latency, now - min(self.sent.values())) if self.sent else latency

    def load(self, now: float) -> float:
        """Its load per loading slot (`loadax.wire.load`) as this client expects it now: what
        the others sent it, as it last said, and what this client sends it."""
        return self._others + self._sending.at(now) / self._slots

    def loaded(self, load: float, slots: int, now: float) -> None:
        """It answered with its `load` per loading slot, of its `slots` (0: not told; one
        counts then, and all the load is this client's)."""
        self._slots = max(slots, 1)
        self._others = max(load - self._sending.at(now) / self._slots, 0.0)

    def send(self, attempt: int, now: float) -> None:
        self.sent[attempt] = now
        self._sending.add(now)
        self.counts.sent()
        if self.quarantined is not None:
            # This attempt probes it: the others keep away until it answers.
            self.down_until = now + self._quarantine_backoff()

    def warm_at(self, sent: float) -> bool:
        """Whether it had answered by `sent`: an attempt sent while it was cold (its loader
        processes may still be starting), given up as hung, is not held against it."""
        return self.warm_since is not None and self.warm_since <= sent

    def answered(self, attempt: int, now: float) -> bool:
        """Attempt `attempt` answered: its latency counts, and its member is well again;
        whether that released it from quarantine."""
        age = now - self.sent.pop(attempt)
        weight = 1.0 if self.latency is None else _EWMA_WEIGHT
        self.latency = (1 - weight) * (self.latency or 0.0) + weight * age
        self.latency_at = now
        self.limit = min(self.limit + 1, self.announced)
        self.counts.answered(age)
        released = self.quarantined is not None
        self.answers += 1
        self.warm_since = now if self.warm_since is None else self.warm_since
        self.wrong = self.failing = False
        self.failures = self.hangs = self.quarantines = 0
        self.down_until, self.quarantined = 0.0, None
        return released

    def abandoned(self, attempt: int, now: float) -> None:
        """Attempt `attempt` is not needed any more: its member is at least as slow as its age."""
        age = now - self.sent.pop(attempt)
        self.latency, self.latency_at = max(self.latency or 0.0, age), now

    def back_off(self, error: str, now: float, counted: bool = True) -> None:
        """A transient failure: kept off briefly, doubling (a quarantine stays until it answers);
        `counted` as a failure unless it is back-pressure."""
        self.failures += 1
        backoff = self._options.backoff_initial * 2 ** (self.failures - 1)
        self.down_until = now + min(backoff, self._options.backoff_max)
        self.last_error = error
        if counted:
            self.failing = True
            self.counts.failed(error)

    def pressed(self, error: str, now: float) -> None:
        """It is full (RESOURCE_EXHAUSTED): sent no more than it holds, after a back-off."""
        self.limit = max(len(self.sent), 1)
        self.back_off(error, now, counted=False)

    def hung(self, error: str, now: float) -> str | None:
        """An attempt was given up: after `HUNG_STRIKES` in a row, quarantined (see
        `quarantine`)."""
        self.hangs += 1
        if self.hangs >= HUNG_STRIKES:
            return self.quarantine(f"{error} ({self.hangs} times in a row)", now)
        self.back_off(error, now)
        return None

    def quarantine(self, error: str, now: float, wrong: bool = False) -> str | None:
        """Wrong for this loader (`wrong`: it serves another pipeline identity): kept off for a
        longer back-off, then probed; what to log when it enters quarantine."""
        self.quarantines += 1
        self.wrong, self.failing = wrong, True
        backoff = self._quarantine_backoff()
        self.down_until, self.last_error = now + backoff, error
        self.counts.failed(error)
        entering, self.quarantined = self.quarantined is None, error
        if not entering:
            return None
        return (
            f"quarantined {self.name}: it is tried again after {backoff:g} s, up to every "
            f"{self._options.quarantine_max:g} s until it answers; its requests go to the "
            f"other workers. It answered: {error}"
        )

    def _quarantine_backoff(self) -> float:
        options = self._options
        backoff = options.quarantine_initial * 2 ** max(self.quarantines - 1, 0)
        return float(min(backoff, options.quarantine_max))


class FleetLatency:
    """The fleet's recent answers' latencies, and their median and p95 once there are enough."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=_RECENT)
        self._count = 0
        self.p50: float | None = None
        self.p95: float | None = None

    def add(self, seconds: float) -> None:
        self._recent.append(seconds)
        self._count += 1
        # Every answer while they are few, then every 16th.
        if self._count >= LATENCY_SAMPLES and (self._count < _RECENT or self._count % 16 == 0):
            ordered = sorted(self._recent)
            self.p50 = ordered[(len(ordered) - 1) // 2]
            self.p95 = ordered[int(0.95 * (len(ordered) - 1))]
