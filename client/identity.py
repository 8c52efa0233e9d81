"""The pipeline identity a `RemoteLoader` binds to, chosen at build from its members' handshakes.

A loader never mixes batches of two identities. At build every target is asked; the identity the
most members answer wins, or the one pinned. A tie between identities is an error naming both
groups: which code to train on is the user's choice, never the list order. A member that answers
another identity, does not serve the pipeline or runs an incompatible loadax is left out.
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


def choose(members: Sequence[Member], pipeline: str, pinned: str | None = None) -> Choice:
    """The identity the most `members` agree on, or the one whose fingerprint starts with
    `pinned`; the error of a lone member, or a `WorkerError` naming every member and its refusal
    when none serves; a ValueError naming each group when two identities tie, or when no member
    serves the pinned one."""
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
    if pinned is not None:
        matching = [identity for identity in counts if identity.fingerprint.startswith(pinned)]
        if not matching:
            raise ValueError(
                f"no target serves pipeline {pipeline!r} with the pinned fingerprint {pinned}: "
                + _groups(members, counts)
            )
        identity = matching[0]
    else:
        (identity, most), *others = counts.most_common()
        if others and others[0][1] == most:
            raise ValueError(
                f"the targets of pipeline {pipeline!r} are split evenly between pipeline "
                f"identities: {_groups(members, counts)}. Pin the one to use with "
                "RemoteDataLoader(...).fingerprint(...), or point the loader at one version. "
                "If they all run the same code, the pipeline is not deterministic (e.g. a map "
                "that calls np.random): `loadax-worker --check` and "
                "`loader.check_determinism()` tell"
            )
    return Choice(
        identity,
        [member for member in members if member.identity == identity],
        [member for member in members if member.identity != identity],
    )


def agreeing(members: Sequence[Member], pinned: str | None = None) -> int:
    """How many members serve the identity that the most of them serve (or the pinned one)."""
    counts = collections.Counter(
        member.identity
        for member in members
        if member.identity is not None
        and (pinned is None or member.identity.fingerprint.startswith(pinned))
    )
    return max(counts.values(), default=0)


def _groups(members: Sequence[Member], counts: collections.Counter[Identity]) -> str:
    return "; ".join(
        f"{identity} from {[m.name for m in members if m.identity == identity]}"
        for identity in counts
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
