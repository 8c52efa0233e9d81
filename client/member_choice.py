"""Which member of those free takes an attempt: of those expected to answer about as soon as the
first, the least loaded; or, for a request with a digest (`affinity`), the one the digest
prefers, so that requests that ask alike meet where the batch is already built.

Expected to answer: (outstanding + 1) x its recent latency (an EWMA, at least the age of its
oldest attempt); a member expected to take more than `1 + ALIKE` times the soonest (one far
behind), whose recent latency is more than `SLOWER` times the fastest's (a straggler, or one
whose attempts were given up or lost the race to a hedge), or whose oldest attempt is
`OVERDUE` (it may have stopped) is passed over. Least loaded: the load it reported with its last
answer, what the other clients send it, and what this client sends it now (`loadax.wire.load`),
for its share of the arc: each client fills its members up to one level, and clients whose arcs
overlap level the fleet between them. Latency alone could not: a member once slow to answer for
its queue would be passed over until its latency went stale, and one that others load looks no
busier than the rest until its queue shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loadax.client.affinity import affinity
from loadax.client.member_health import LATENCY_SAMPLES, MemberHealth

ALIKE = 2.0
"""Members expected to answer within (1 + ALIKE) x the soonest are alike: the load is spread
over them by their load..."""
SLOWER = 3.0
"""... unless a member's own recent latency is over this many times the fastest's (one slower
by itself, not for its queue: passed over until its latency goes stale)..."""
OVERDUE = 1.5
"""... or its oldest attempt outstanding is this many times the fastest's latency old (it may
have stopped: no more of the client's requests wait on it until that attempt is answered,
hedged or given up)."""
AFFINITY_SLOWER = 4.0
"""A request with a digest passes over a member expected to answer this many times slower than
the fastest with room (a straggler, or one its queue slows, once its latency is settled, or
one whose oldest attempt outstanding is that old), whatever the digest prefers."""


def _keeps_up(member: MemberHealth, now: float, typical: float) -> bool:
    """Whether `member` is neither slow by itself nor overdue (`SLOWER`, `OVERDUE`), against
    the fastest member's recent latency, `typical`."""
    if member.sent and now - min(member.sent.values()) > OVERDUE * typical:
        return False
    return member.expected_latency(now, typical) <= SLOWER * typical


def choose(
    members: Sequence[MemberHealth], shares: Mapping[str, float], now: float, digest: bytes
) -> MemberHealth:
    """Of `members` (free, at least one), the one to send an attempt to; `shares`: each one's
    share of the client's arc (1 where it has none); `digest`: the request's, b"" for none."""
    known = [member.fresh_latency(now) for member in members]
    typical = min((latency for latency in known if latency is not None), default=0.0)
    if digest:  # requests that ask alike meet: the preferred of those with room
        # A member's own latency counts once it has answered `LATENCY_SAMPLES` times: a slow
        # first answer (its cold start, seen by this client only) does not send a digest away
        # from the member where the other clients' requests for it meet.
        latencies = [
            member.expected_latency(now, typical, own=member.answers >= LATENCY_SAMPLES)
            for member in members
        ]
        fast = [
            member
            for member, latency in zip(members, latencies, strict=True)
            if latency <= AFFINITY_SLOWER * min(latencies)
        ]
        return min(
            fast, key=lambda member: affinity(digest, member.name, shares.get(member.name, 1.0))
        )
    expected = [(len(m.sent) + 1) * m.expected_latency(now, typical) for m in members]
    soonest = min(expected) * (1 + ALIKE)
    alike = [m for m, answer in zip(members, expected, strict=True) if answer <= soonest]
    # Of those, the ones that keep up, if any (none may: each far behind, or the fastest overdue).
    quick = [m for m in alike if _keeps_up(m, now, typical)]
    return min(
        quick or alike,
        key=lambda member: (member.load(now) / shares.get(member.name, 1.0), len(member.sent)),
    )
