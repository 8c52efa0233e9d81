"""What a loader's start-up heard from each target it asked, how long it waits for them to agree,
and the error that names them all when too few agreed in time (`loadax.client.membership`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from loadax.client.identity import Choice, agreeing, choose
from loadax.client.member import Identity, Member
from loadax.errors import WorkerError
from loadax.logfields import fields

_log = logging.getLogger("loadax.client")

GRACE = 1.0
"""Seconds the build waits for the other targets once `min_workers` agree."""


@dataclasses.dataclass
class Listed:
    """A listed address's place (its order breaks ties) and what it said so far."""

    order: tuple[int, int]
    name: str
    said: str = "no answer yet"
    member: Member | None = None
    settled: bool = False  # answered, or failed for good
    final_since: float | None = None  # failing in a way that waiting does not mend, since


class StartupWait:
    """The build's wait for targets to agree: over once every target has settled, at
    `deadline`, once every target has been failing for good for `give_up_after` seconds, or
    `GRACE` seconds after `min_workers` agreed (on the `pinned` fingerprint, if any). Time is an
    argument: `look` is told what the targets said, and when.

    >>> wait = StartupWait(1, None, deadline=10.0, give_up_after=None)
    >>> wait.look([Listed((0, 0), "grpc://a:1")], now=4.0)
    6.0
    >>> wait.look([Listed((0, 0), "grpc://a:1", settled=True)], now=5.0) is None
    True
    """

    def __init__(
        self, min_workers: int, pinned: str | None, deadline: float, give_up_after: float | None
    ) -> None:
        self._min_workers, self._pinned = min_workers, pinned
        self._deadline, self._give_up_after = deadline, give_up_after
        self._agreed_at: float | None = None
        self.members: list[Member] = []  # those that answered, at the last look
        self.agreed = 0  # ... of which agree
        self.settled = False  # whether every target had settled
        self.hopeless = float("inf")  # when every target will have failed for good long enough

    def look(self, listed: Sequence[Listed], now: float) -> float | None:
        """What the targets `listed` said by `now`: None once the wait is over, else how many
        seconds to wait for news before looking again."""
        self.members = [each.member for each in listed if each.member is not None]
        self.agreed = agreeing(self.members, self._pinned)
        if self.agreed >= self._min_workers and self._agreed_at is None:
            self._agreed_at = now
        self.settled = all(each.settled for each in listed)
        self.hopeless = hopeless_at(listed, self._give_up_after)
        if self.settled or now >= min(self._deadline, self.hopeless):
            return None
        if self._agreed_at is not None and now >= self._agreed_at + GRACE:
            return None
        wake = self._deadline if self._agreed_at is None else self._agreed_at + GRACE
        return min(wake, self._deadline, self.hopeless) - now


def hopeless_at(listed: Sequence[Listed], give_up_after: float | None) -> float:
    """When every target will have been failing for good for `give_up_after` (inf: not)."""
    since = [each.final_since for each in listed]
    final = [moment for moment in since if moment is not None]
    if give_up_after is None or not since or len(final) < len(since):
        return float("inf")
    return max(final) + give_up_after


def startup_failure(
    said: Sequence[tuple[str, str]],
    pipeline: str,
    min_workers: int,
    agreeing: int,
    gave_up_after: float | None,
    timeout: float,
) -> WorkerError:
    """The error of a start-up at which `agreeing` targets of those that `said` what they said
    agreed, `min_workers` being needed: after `timeout`, or (`gave_up_after` not None) once
    every target had been failing for good that long.

    >>> print(startup_failure([("grpc://a:1", "refused")], "images", 1, 0, 2.0, 30.0))
    UNAVAILABLE: no target of pipeline 'images' can be reached, each for 2 s (startup \
give_up_after): grpc://a:1: refused
    """
    told = "; ".join(f"{name}: {what}" for name, what in said)
    if gave_up_after is not None:
        return WorkerError(
            "UNAVAILABLE",
            f"no target of pipeline {pipeline!r} can be reached, each for "
            f"{gave_up_after:g} s (startup give_up_after): {told}",
        )
    return WorkerError(
        "UNAVAILABLE",
        f"{agreeing} of {len(said)} targets agreed to serve pipeline {pipeline!r} within "
        f"{timeout:g} s; {min_workers} needed (min_workers). {told}",
    )


def bound_choice(
    members: Sequence[Member],
    agreed: int,
    min_workers: int,
    pipeline: str,
    pinned: str | None,
    fallback: Identity | None,
) -> Choice | None:
    """What a loader binds to once the start-up's wait is over, `agreed` of `members` agreeing:
    their identity when at least `min_workers` do (`choose`), else the local members' `fallback`
    (logged; `fallback_choice`), else None. A ValueError when identities tie or another is
    pinned."""
    if agreed >= min_workers:
        return choose(members, pipeline, pinned)
    if fallback is None:
        return None
    choice = fallback_choice(members, fallback, pinned, pipeline)
    _log.warning(
        "%d targets of pipeline %r agreed in time: running from local members, and workers "
        "join as they answer",
        agreed,
        pipeline,
        extra=fields(event="fleet_down", pipeline=pipeline),
    )
    return choice


def fallback_choice(
    members: Sequence[Member], identity: Identity, pinned: str | None, pipeline: str
) -> Choice:
    """The local members' `identity`, bound to when too few targets agreed in time, with the
    members that serve it; a ValueError saying why not when a member serves another or another
    is pinned: local members never outvote a worker."""
    if pinned is not None and not identity.fingerprint.startswith(pinned):
        raise ValueError(
            f"too few targets of pipeline {pipeline!r} agreed in time, and the local members' "
            f"{identity} is not the pinned fingerprint {pinned}"
        )
    for member in members:
        if member.identity not in (None, identity):
            raise ValueError(
                f"too few targets of pipeline {pipeline!r} agreed in time, and local members "
                f"never outvote a worker: {member.name} serves {member.identity}, the local "
                f"members {identity}"
            )
    return Choice(
        identity,
        [member for member in members if member.identity == identity],
        [member for member in members if member.identity != identity],
    )
