"""Tails: when an attempt is hung, when a request is hedged, and how many extra attempts (hedges
and re-issues of hung attempts) a client may send.

One of the `HEDGED_FRONT` oldest requests (those that block in-order delivery) is also sent to
another member once its newest attempt is `HEDGE_FACTOR` x the fleet's p95 latency old (a hedge
that lands on a slow member is hedged in turn); an attempt older than `HUNG_FACTOR` x p95 (at
least `HUNG_FLOOR`) is given up as hung (it still wins if it answers first). Extra attempts add
at most `EXTRA_SHARE` of the requests answered: a share earned with time, at the rate requests
are answered, so that a loop held up by slow requests (which admits none) still earns its hedge.
The next of these deadlines is when the policy next needs time to pass (`due_at`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Sequence

from loadax.client.fleet_options import FleetOptions
from loadax.client.member_health import FleetLatency
from loadax.client.outstanding import Attempt, Outstanding, Request

HEDGE_FACTOR = 1.5
"""A request this many times the fleet's p95 latency old is also sent to another member."""
HUNG_FACTOR = 8.0
"""An attempt this many times the fleet's p95 latency old is given up as hung..."""
HUNG_FLOOR = 1.0
"""... but never one younger than this (seconds): scheduling noise is not a hang."""
HEDGED_FRONT = 2
"""The oldest requests outstanding that may be hedged: those that block in-order delivery."""
EXTRA_SHARE = 0.1
"""Hedges and re-issues of hung attempts add at most this share of the requests answered."""
EXTRA_BURST = 4.0
"""The most extra attempts saved up for a burst of slow requests."""


def thresholds(latency: FleetLatency, options: FleetOptions) -> tuple[float, float | None]:
    """(the age at which an attempt is hung, the age at which a request is hedged; None: not
    yet, the fleet's p95 is not known)."""
    p95, hung = latency.p95, options.request_timeout
    if p95 is not None:
        hung = min(hung, max(HUNG_FLOOR, HUNG_FACTOR * p95))
    hedge = options.hedge_after
    if hedge == "auto":
        return hung, None if p95 is None else HEDGE_FACTOR * p95
    return hung, hedge


def front(requests: Collection[Request]) -> list[Request]:
    """The `HEDGED_FRONT` oldest of `requests` (outstanding): they go out in step order, so
    they block the in-order delivery of the others, and are the only ones worth hedging."""
    return heapq.nsmallest(HEDGED_FRONT, requests, key=lambda request: request.started)


def due_at(outstanding: Outstanding, hung: float, hedge: float | None) -> float:
    """The first time an attempt of `outstanding` not given up is `hung` old, or one of its
    `front` requests is `hedge` old since its newest such attempt (inf: never; -inf: at once,
    for a request failing or without a live attempt, which is sent again when it can be)."""
    due = min(
        (attempt.sent + hung for attempt in outstanding.attempts.values() if not attempt.given_up),
        default=math.inf,
    )
    for request in outstanding.admitted.values():
        if request.failing_since is not None or outstanding.none_live(request):
            return -math.inf
    if hedge is not None:
        for request in front(outstanding.admitted.values()):
            sent = [attempt.sent for attempt in outstanding.live(request) if not attempt.given_up]
            due = min(due, max(sent) + hedge)
    return due


def overdue(attempts: Sequence[Attempt], now: float, hung: float) -> list[Attempt]:
    """Those of a request's `attempts` not given up yet that are `hung` seconds old: hung."""
    return [attempt for attempt in attempts if not attempt.given_up and now - attempt.sent >= hung]


def resend(
    attempts: Sequence[Attempt], now: float, hedge: float | None, timeout: float
) -> bool | None:
    """Whether a request with `attempts` out (hung ones given up) goes to another member now:
    None: not now; False: freely (it has none, its hung attempts' members are quarantined, or
    `timeout`, `request_timeout`, passed); True: as an extra attempt (its hung attempts are
    re-issued, or its newest live one is `hedge` old)."""
    live = [attempt for attempt in attempts if not attempt.given_up]
    if not live:
        free = any(
            attempt.member.quarantined is not None or now - attempt.sent >= timeout
            for attempt in attempts
        )
        return bool(attempts) and not free
    if hedge is not None and now - max(attempt.sent for attempt in live) >= hedge:
        return True
    return None


class ExtraShare:
    """The extra attempts a client may send now: `EXTRA_SHARE` of the requests answered, earned
    with time at their (smoothed) rate, at most `EXTRA_BURST` saved."""

    def __init__(self) -> None:
        self._credit = EXTRA_BURST
        self._earned_at = 0.0

    def earn(self, now: float, rate: float | None) -> None:
        """Time passed until `now` at `rate` requests answered a second (None: not known)."""
        earned = EXTRA_SHARE * (rate or 0.0) * (now - self._earned_at)
        self._credit = min(self._credit + earned, EXTRA_BURST)
        self._earned_at = now

    @property
    def left(self) -> bool:
        """Whether an extra attempt may be sent now."""
        return self._credit >= 1.0

    def spend(self) -> None:
        """One extra attempt was sent."""
        self._credit -= 1.0
