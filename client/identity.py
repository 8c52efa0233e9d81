"""The pipeline identity a `RemoteLoader` binds to, chosen at build from its members' handshakes.

A loader never mixes batches of two identities. At build every target is asked; the identity the
most members answer wins, a tie going to the member listed first. A member that answers another
identity, does not serve the pipeline or runs an incompatible loadax is left out, not fatal.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from loadax.client.member import Identity, Member
from loadax.errors import WorkerError


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """The identity a loader binds to, the members that serve it and those left out."""

    identity: Identity
    chosen: list[Member]
    left_out: list[Member]

    def why_left_out(self, member: Member) -> str:
        """What `member` said that left it out, for logs and `LoaderStats.left_out`."""
        if member.identity is None:
            return str(member.refusal)
        return f"another pipeline identity: {member.identity}; the loader's is {self.identity}"


def choose(members: Sequence[Member], pipeline: str) -> Choice:
    """The identity the most `members` agree on (a tie goes to the one answered first), or the
    error of a lone member, or a `WorkerError` naming every member and its refusal."""
    counts = collections.Counter(m.identity for m in members if m.identity is not None)
    if not counts:
        refusals = [member.refusal for member in members if member.refusal is not None]
        if len(refusals) == 1:
            raise refusals[0]
        codes = {refusal.code for refusal in refusals}
        raise WorkerError(
            codes.pop() if len(codes) == 1 else "FAILED_PRECONDITION",
            f"no target serves pipeline {pipeline!r} to this client: "
            + "; ".join(f"{member.name} answered {member}" for member in members),
        )
    # A Counter keeps first-answered order, and max() returns the first of equals.
    identity = max(counts, key=counts.__getitem__)
    return Choice(
        identity,
        [member for member in members if member.identity == identity],
        [member for member in members if member.identity != identity],
    )


def require(member: Member, expected: Identity, pipeline: str) -> None:
    """Refuse a member joining a loader bound to `expected`: its refusal, or a ValueError naming
    both identities."""
    if member.refusal is not None:
        raise member.refusal
    if member.identity != expected:
        raise ValueError(
            f"{member.name} serves pipeline {pipeline!r} with {member.identity}, the "
            f"loader's workers with {expected}"
        )
