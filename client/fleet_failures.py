"""What the policy tells of a fleet that cannot serve: when a request is given up
(`given_up`), the errors the training loop gets and the warning while every member fails, each
naming every member and the first line of its last error, bounded whatever the members said,
and the log of a member entering quarantine (`entering`)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

from loadax.client.fleet_events import Note
from loadax.client.member_health import MemberHealth
from loadax.errors import WorkerError
from loadax.logfields import fields

ERROR_CHARS = 200
"""The most characters of one member's last error in a message naming every member."""
WARN_EVERY = 10.0
"""Seconds between warnings while every member is failing."""


def silent(step: int, limit: float, members: Iterable[MemberHealth]) -> WorkerError:
    """The fleet has answered nothing for `limit` seconds (`no_worker_timeout`), from `step` on."""
    return WorkerError(
        "UNAVAILABLE",
        f"no worker answered for {limit:g} s (no_worker_timeout), from step {step} on; "
        f"workers: {describe(members)}",
    )


def failing(step: int, limit: float, members: Iterable[MemberHealth]) -> WorkerError:
    """Every member has been failing `step` for `limit` seconds while the fleet answered others."""
    return WorkerError(
        "UNAVAILABLE",
        f"every worker failed step {step} for {limit:g} s (no_worker_timeout); "
        f"workers: {describe(members)}",
    )


def given_up(
    step: int,
    silent_s: float,
    failing_s: float | None,
    limit: float,
    members: Collection[MemberHealth],
) -> tuple[WorkerError, bool] | None:
    """How a request for `step` fails, and whether every request fails with it; None: not yet.
    Every request once the fleet has answered nothing for `limit` seconds
    (`no_worker_timeout`, `silent_s` so far); this one once every member has been failing it
    that long (`failing_s`, None: none is), and every other with it when every member is
    failing now (the fleet serves nothing)."""
    if silent_s >= limit:
        return silent(step, limit, members), True
    if failing_s is None or failing_s < limit:
        return None
    return failing(step, limit, members), all(member.failing for member in members)


def entering(member: MemberHealth, quarantined: str | None) -> list[Note]:
    """The log of `member` entering quarantine (`quarantined`: what to say; None: it did not)."""
    if quarantined is None:
        return []
    facts = fields(event="quarantined", target=member.name, error=member.last_error)
    return [Note(logging.WARNING, quarantined, facts)]


def serving_another(members: Iterable[MemberHealth]) -> WorkerError:
    """Every member serves another pipeline identity: a rolling update replaced the fleet."""
    return WorkerError(
        "FAILED_PRECONDITION",
        "no worker serves this loader's pipeline identity any more: the fleet now serves "
        f"another (restart the job to use it); workers: {describe(members)}",
    )


class FailingWarnings:
    """The warning that every member is failing: at once, then every `WARN_EVERY` seconds while
    it lasts and requests wait."""

    def __init__(self) -> None:
        self._warned_at: float | None = None

    def due(
        self,
        now: float,
        waiting: bool,
        silent_s: float,
        limit: float,
        members: Collection[MemberHealth],
    ) -> list[Note]:
        """What to log at `now` (`silent_s`: since the fleet last answered; `limit`:
        `no_worker_timeout`). Called at every tick: a healthy fleet costs one member's look."""
        if not waiting or not all(member.failing for member in members):
            self._warned_at = None
            return []
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY:
            return []
        self._warned_at = now
        return warnings(silent_s, limit, members)


def warnings(silent_s: float, limit: float, members: Iterable[MemberHealth]) -> list[Note]:
    """The warning that every member is failing, then (at DEBUG) each member's, with its facts as
    fields for a log collector."""
    members = list(members)
    notes = [
        Note(
            logging.WARNING,
            f"every worker is failing: none answered for {silent_s:.3g} s; iteration raises at "
            f"{limit:g} s (no_worker_timeout). Workers: {describe(members)}",
            fields(event="fleet_failing", duration_s=silent_s, status="UNAVAILABLE"),
        )
    ]
    notes += [
        Note(
            logging.DEBUG,
            f"{member.name} is failing: {first_line(member.last_error)}",
            fields(event="member_failing", target=member.name, error=member.last_error),
        )
        for member in members
    ]
    return notes


def describe(members: Iterable[MemberHealth]) -> str:
    """Each member and the first line of its last error, marking those quarantined."""
    return (
        "; ".join(
            f"{member.name} ({first_line(member.last_error)}"
            f"{'; quarantined' if member.quarantined is not None else ''})"
            for member in members
        )
        or "none in use"
    )


def first_line(text: str) -> str:
    """The first line of `text`, cut to `ERROR_CHARS`.

    >>> first_line("UNAVAILABLE: reset\\nTraceback ...")
    'UNAVAILABLE: reset'
    """
    line = text.partition("\n")[0]
    return line if len(line) <= ERROR_CHARS else f"{line[: ERROR_CHARS - 3]}..."
