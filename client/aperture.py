"""One client's aperture over time: which members of the fleet it is connected to, and which
its requests go to, sized to its demand. The policy (`loadax.client.policy`) drives it; like
the policy it holds no threads or clocks (time comes in as `now`).

The members, connected or not, are the ring (`loadax.client.subset`); the aperture is the arc
from the client's seat at least its share of the fleet wide (so the job's clients use every
member evenly) and `HEADROOM` x the members its requests in flight need, measured every
`RESHAPE_EVERY` (wider at once, narrower by `NARROWING`), never more than `subset`. Listed
members that enter the arc are connected (`Connect`); members out of it for `LINGER` with
nothing outstanding are disconnected. A member failing stays in the arc (the policy probes it)
but takes none of its width: the arc reaches one member further, within the cap. One failing
for `LINGER_FAILING` while there are members beyond the arc is disconnected and kept off for a
doubling back-off (as one that could not be connected is); then connected again, its handshake
a probe: failover reaches the whole fleet.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping

from loadax.client.fleet_events import Connect, Disconnect
from loadax.client.fleet_options import FleetOptions
from loadax.client.member_health import MemberHealth
from loadax.client.subset import MIN_WIDTH, Seat, aperture

RESHAPE_EVERY = 0.5
"""Seconds between looks at how wide the aperture must be."""
RATE_WEIGHT = 0.2
"""Of each `RESHAPE_EVERY`'s rate in the smoothed rate of requests: answers come in waves."""
NARROWING = 0.8
"""The most an aperture narrows at a time (each `RESHAPE_EVERY`)."""
HEADROOM = 1.5
"""The aperture holds this many times the members that the requests in flight need (by
Little's law: the rate requests are answered at, smoothed, x the fleet's median latency,
`in_flight_per_worker` to a member), so that a loop held back by too narrow an arc widens it."""
LINGER = 5.0
"""Seconds a connected member stays out of the aperture before it is disconnected."""
LINGER_FAILING = 1.0
"""Seconds a member of the aperture may fail before it is disconnected for others beyond."""
KEEP_OFF_MAX = 30.0
"""The longest a member that failed in the aperture, or could not be connected, is kept off
(doubling from `quarantine_initial` until it answers): a whole arc of failing members is left
behind, whatever their number."""


class Aperture:
    """The ring, the arc requests go to, and the connections to make and drop (see the module).

    `members` (the policy's, by name) are the connected ones; `reshape` says which to connect
    and which to disconnect, and the policy carries that out.
    """

    def __init__(self, options: FleetOptions, seat: Seat) -> None:
        self.options = options
        self.seat = seat
        self.ring: list[str] = []  # every member, connected or not, sorted
        self.active: dict[str, float] = {}  # the arc: member -> its share of it
        self._connected: set[str] = set()
        self._listed: set[str] = set()  # not connected
        self._connecting: set[str] = set()  # ... asked to connect
        self._kept_off: dict[str, tuple[float, float]] = {}  # until, back-off
        self._spare: dict[str, float] = {}  # connected, out of the arc (or failing) since
        self._width = float(MIN_WIDTH)  # until demand is known
        self._reshaped = 0.0  # when the arc was last sized
        self._changed = True  # the membership changed since
        self._resolved = 0  # requests resolved since
        self._rate: float | None = None  # requests resolved per second, smoothed

    @property
    def rate(self) -> float | None:
        """Requests answered per second, smoothed (None until first measured)."""
        return self._rate

    def depth(self, members: Mapping[str, MemberHealth], now: float) -> int:
        """How many requests to keep outstanding: `in_flight_per_worker` per member of the arc
        (of `members`, those connected) that is up, within its limit; at least 1, so that
        requests still find out when none is."""
        per_member = self.options.in_flight_per_worker
        total = 0
        for name in self.active:
            member = members.get(name)
            if member is not None and member.quarantined is None and member.down_until <= now:
                total += min(member.limit, per_member)
        return max(total, 1)

    def due(self, now: float) -> bool:
        """Whether `reshape` is due: the membership changed, or `RESHAPE_EVERY` passed."""
        return self._changed or now >= self._reshaped + RESHAPE_EVERY

    def resolved(self) -> None:
        """A request was answered: demand, for the width."""
        self._resolved += 1

    # Membership.

    def listed(self, name: str) -> None:
        """`name` is in the fleet, not connected."""
        if self._place(name):
            self._listed.add(name)

    def joined(self, name: str) -> None:
        """`name` is connected."""
        self._place(name)
        self._connected.add(name)
        self._listed.discard(name)
        self._connecting.discard(name)
        if name in self._kept_off:  # its back-off doubles until it answers
            self._kept_off[name] = (0.0, self._kept_off[name][1])
        self._changed = True

    def unreached(self, name: str, now: float) -> bool:
        """A connect to `name` failed: it stays listed, tried again after a doubling back-off.
        False if it was not being connected (then nothing changes)."""
        if name not in self._connecting:
            return False
        self._connecting.discard(name)
        self._keep_off(name, now)
        self._changed = True
        return True

    def answered(self, name: str) -> None:
        """`name` answered: a later failure backs off from the start again."""
        self._kept_off.pop(name, None)

    def left(self, name: str) -> None:
        """`name` left the fleet."""
        at = bisect.bisect_left(self.ring, name)
        if at < len(self.ring) and self.ring[at] == name:
            del self.ring[at]
            self._changed = True
        for names in (self._connected, self._listed, self._connecting):
            names.discard(name)
        for by_name in (self._kept_off, self.active, self._spare):
            by_name.pop(name, None)

    # Shape.

    def reshape(
        self, now: float, members: Mapping[str, MemberHealth], latency: float | None
    ) -> list[Connect | Disconnect]:
        """Size the arc to the demand seen since the last time (`latency`: the fleet's median),
        let go of the `members` spare, and connect the listed members that entered the arc,
        within the cap: the connections to make and drop, in order."""
        elapsed = now - self._reshaped
        if elapsed >= RESHAPE_EVERY:
            rate = self._resolved / elapsed
            self._rate = (
                rate if self._rate is None else self._rate + RATE_WEIGHT * (rate - self._rate)
            )
            if latency is not None:  # wider at once, narrower by steps
                in_flight = self._rate * latency  # by Little's law
                needed = HEADROOM * in_flight / self.options.in_flight_per_worker + 1
                self._width = max(needed, self._width * NARROWING)
                self._width = min(self._width, float(self.options.subset))
            self._resolved, self._reshaped = 0, now
        self._changed = False
        cap = self.options.subset
        width = min(max(self.seat.cover(len(self.ring)), self._width, MIN_WIDTH), cap)
        usable = functools.partial(self._usable, now=now)

        def counted(name: str) -> bool:  # failing members take none of the width
            member = members.get(name)
            return member is None or not member.failing

        self.active = aperture(self.ring, self.seat, width, usable, cap, counted)
        changes: list[Connect | Disconnect] = []
        if self._let_go(members, now, changes):  # the arc reaches past those kept off
            self.active = aperture(self.ring, self.seat, width, usable, cap, counted)
        # Within the cap: a spare member goes at once to make room for one the arc needs.
        room = cap - len(self._connected) - len(self._connecting)
        for name in self.active:
            if name not in self._listed or name in self._connecting:
                continue
            if room <= 0:
                spare = [each for each in self._spare if not members[each].sent]
                if not spare:
                    break  # at the next reshape, when one has finished
                changes.append(self._disconnect(spare[0]))
                room += 1
            self._connecting.add(name)
            changes.append(Connect(name))
            room -= 1
        return changes

    def _let_go(
        self, members: Mapping[str, MemberHealth], now: float, changes: list[Connect | Disconnect]
    ) -> bool:
        """Disconnect (into `changes`) the members spare for long enough with nothing
        outstanding: out of the arc for `LINGER`, or failing in it for `LINGER_FAILING` while
        there are members beyond it, then kept off for a back-off; whether one was kept off."""
        kept_off = False
        beyond = len(self.ring) > len(self.active)
        for name, member in members.items():
            inside, failing = name in self.active, member.failing and beyond
            if inside and not failing:
                self._spare.pop(name, None)
                continue
            linger = LINGER_FAILING if inside else LINGER
            if now - self._spare.setdefault(name, now) >= linger and not member.sent:
                changes.append(self._disconnect(name))
                if inside:
                    self._keep_off(name, now)
                    kept_off = True
        return kept_off

    def _disconnect(self, name: str) -> Disconnect:
        del self._spare[name]
        self._connected.discard(name)
        self._listed.add(name)
        return Disconnect(name)

    def _place(self, name: str) -> bool:
        """Put `name` on the ring; False if it is there already."""
        at = bisect.bisect_left(self.ring, name)
        if at < len(self.ring) and self.ring[at] == name:
            return False
        self.ring.insert(at, name)
        self._changed = True
        return True

    def _keep_off(self, name: str, now: float) -> None:
        """Keep listed member `name` out of the arc for a back-off, doubling each time."""
        _, previous = self._kept_off.get(name, (0.0, 0.0))
        backoff = min(max(previous * 2, self.options.quarantine_initial), KEEP_OFF_MAX)
        self._kept_off[name] = (now + backoff, backoff)

    def _usable(self, name: str, now: float) -> bool:
        """Whether the arc may hold `name` now: connected, or not backing off from a failed
        connect."""
        return name in self._connected or self._kept_off.get(name, (0.0, 0.0))[0] <= now
