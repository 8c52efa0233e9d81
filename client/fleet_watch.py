"""Which members are local, and the log of a loader running from its local members alone while
no remote worker answers (and of its return to the fleet)."""

from __future__ import annotations

import logging

from loadax.logfields import fields

_log = logging.getLogger("loadax.client")

LOCAL_PREFIX = "local "
"""Local members are named `local 0`, `local 1`, ...: names no address can have."""


def is_local(name: str) -> bool:
    """Whether member `name` is a local one."""
    return name.startswith(LOCAL_PREFIX)


class FleetWatch:
    """Logs when every remote member's last attempt failed while local members remain (the
    loader runs from them), and when a remote member answers again. Driven by one thread."""

    def __init__(self) -> None:
        self._failing: set[str] = set()
        self._down = False

    def outcome(self, member: str, answered: bool, members: list[str]) -> None:
        """`member` answered its latest attempt, or failed it; `members`: those connected."""
        if is_local(member):
            return
        if answered:
            self._failing.discard(member)
        else:
            self._failing.add(member)
        self._check(members)

    def left(self, member: str, members: list[str]) -> None:
        self._failing.discard(member)
        self._check(members)

    def _check(self, members: list[str]) -> None:
        local = [name for name in members if is_local(name)]
        remote = [name for name in members if not is_local(name)]
        down = bool(local and remote) and set(remote) <= self._failing
        if down and not self._down:
            _log.warning(
                "no remote worker answers (%s): running from %d local members until one does",
                ", ".join(remote),
                len(local),
                extra=fields(event="fleet_down"),
            )
        elif self._down and not down:
            _log.info(
                "a remote worker answers again: back to the fleet", extra=fields(event="fleet_back")
            )
        self._down = down
