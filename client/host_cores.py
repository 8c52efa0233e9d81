"""Who makes batches on the trainer's host: its local members, and workers on the same host (a
worker whose handshake took the shared-memory probe, `loadax.wire.shared_memory`). A same-host
worker keeps the cores it loads on (its loading slots, as its handshake said): "auto" gives the
local members the others, while it answers (`kept`, `loadax.client.spare_cores`), and it is used
beside them, as any worker. Workers whose slots take every core (or that did not say) share the
trainer's cores instead, and a local member's batch costs the host the least CPU: made where it
is used, it is not encoded for a socket or a memory file, copied or checksummed. So while the
local members hold every usable core of the host and one of them can take requests, such a
worker is passed over: sent no request the others can take, counted in no depth. It stays the
fallback:
used again as soon as the local members hold fewer cores (given back, e.g. for a slowed training
loop) or none of them can take requests (failing, quarantined, gone), and for a request that no
other member can take (its attempt there failed or hung). Not for a hedge: its bet that another
member is faster cannot pay on the cores the members are using, where it only slows them.

Pure state, told by the policy what the local members hold (`LocalCores`, which
`loadax.client.local_members` reports); which members are same-host workers is theirs to say
(`MemberHealth.same_host`, with their `slots`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from loadax.client.fleet_events import Note
from loadax.client.fleet_watch import is_local
from loadax.client.member_health import MemberHealth
from loadax.logfields import fields


class HostCores:
    """The trainer host's cores the local members hold (`cores`) of those this process may use
    (`usable`), and the same-host workers among `members` (the policy's, connected) passed over
    for it (see the module).

    >>> from loadax.client.fleet_options import FleetOptions
    >>> members = {
    ...     "local 0": MemberHealth("local 0", 2, FleetOptions()),
    ...     "w": MemberHealth("w", 2, FleetOptions(), same_host=True),
    ... }
    >>> host = HostCores(members)
    >>> host.held(cores=1, usable=2)
    []
    >>> list(host.in_use(now=0.0))
    ['local 0', 'w']
    >>> [note.message for note in host.held(cores=2, usable=2)]
    ['w, on this host, passed over: local members hold 2 of its 2 cores']
    >>> list(host.in_use(now=0.0)), host.kept_off(busy=set(), now=0.0)
    (['local 0'], frozenset({'w'}))
    >>> host.kept_off(busy={"local 0"}, now=0.0)  # no one else can take it
    frozenset()
    >>> host.kept_off(busy={"local 0"}, now=0.0, hedge=True)  # a bet on the same cores
    frozenset({'w'})
    >>> members["local 0"].down_until = 1.0  # backing off: the worker is the fallback
    >>> list(host.in_use(now=0.0))
    ['local 0', 'w']
    >>> members["local 0"].down_until = 0.0
    >>> members["w"] = MemberHealth("w", 2, FleetOptions(), same_host=True, slots=1)
    >>> list(host.in_use(now=0.0))  # a core of its own: used beside the members
    ['local 0', 'w']
    """

    def __init__(self, members: Mapping[str, MemberHealth]) -> None:
        self._members = members
        self.cores = self.usable = 0

    def held(self, cores: int, usable: int) -> list[Note]:
        """The local members hold `cores` of the host's `usable` ones; what to log of the
        same-host workers when they hold every core, or no more."""
        was = self.holds
        self.cores, self.usable = cores, usable
        workers = sorted(self._sharing())
        if not workers or was == self.holds:
            return []
        named, held = ", ".join(workers), f"local members hold {cores} of its {usable} cores"
        if self.holds:
            message, event = f"{named}, on this host, passed over: {held}", "same_host_passed_over"
        else:
            message, event = f"{named}, on this host, used again: {held}", "same_host_used"
        return [Note(logging.INFO, message, fields(event=event, worker=workers))]

    @property
    def holds(self) -> bool:
        """Whether the local members hold every usable core of the host."""
        return self.cores >= max(self.usable, 1)

    def passed_over(self, now: float) -> frozenset[str]:
        """The members passed over at `now`: the same-host workers, while the local members
        hold every usable core and one of them can take requests."""
        if not self.holds:
            return frozenset()
        ready = any(
            is_local(name) and member.quarantined is None and member.down_until <= now
            for name, member in self._members.items()
        )
        if not ready:
            return frozenset()
        return self._sharing()

    def _sharing(self) -> frozenset[str]:
        """The same-host workers, if they share the trainer's cores: their loading slots take
        every usable core, or one did not say; else none (they keep cores of their own, and the
        members hold the others)."""
        workers = {name: member for name, member in self._members.items() if member.same_host}
        slots = [member.slots for member in workers.values()]
        if all(slots) and sum(slots) < self.usable:
            return frozenset()
        return frozenset(workers)

    def kept(self) -> int:
        """The cores that the same-host workers keep: their loading slots (as their handshakes
        said), but those of a worker whose last attempt failed or hung, until it answers again
        (its cores go to the local members meanwhile, `loadax.client.spare_cores`).

        >>> from loadax.client.fleet_options import FleetOptions
        >>> members = {"w": MemberHealth("w", 2, FleetOptions(), same_host=True, slots=1)}
        >>> HostCores(members).kept()
        1
        >>> members["w"].failing = True
        >>> HostCores(members).kept()
        0
        """
        return sum(
            member.slots
            for member in self._members.values()
            if member.same_host and not member.failing and member.quarantined is None
        )

    def in_use(self, now: float) -> Mapping[str, MemberHealth]:
        """The members but those passed over: those the depth counts."""
        passed = self.passed_over(now)
        return {name: m for name, m in self._members.items() if name not in passed}

    def kept_off(self, busy: set[str], now: float, hedge: bool = False) -> frozenset[str]:
        """The members that a request whose attempts or failures are at `busy` is not sent to:
        those passed over, unless no other member could take it and it is no `hedge` (another
        attempt of it is live)."""
        passed = self.passed_over(now)
        return frozenset() if self._members.keys() <= busy | passed and not hedge else passed
