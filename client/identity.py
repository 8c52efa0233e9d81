"""The pipeline identity a `RemoteLoader` binds to, chosen at build from its targets' handshakes.

A loader never mixes batches of two identities. At build every target is asked; the identity the
most targets answer wins, a tie going to the target given first. A target that answers another
identity, does not serve the pipeline or runs an incompatible loadax is left out, not fatal.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import loadax
from loadax.client.targets import Target
from loadax.errors import WorkerError
from loadax.plan.planner import Plan
from loadax.wire.plans import compatible_versions, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

# Handshake refusals that leave one target out: no such pipeline, an incompatible version. Any
# other error (an unreachable target, a plan the worker rejects) still fails the build.
LEAVES_OUT = frozenset({"NOT_FOUND", "FAILED_PRECONDITION"})


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """What a loader binds to: the pipeline's fingerprint (a digest of its config, code and
    content), its number of records and its stream window (0: not a stream).

    >>> print(Identity("5487d6af85f2c0ffee", 100))
    fingerprint 5487d6af85f2, 100 records
    """

    fingerprint: str
    num_records: int
    stream_window: int = 0

    @classmethod
    def of(cls, response: wire.HandshakeResponse) -> Identity:
        return cls(response.fingerprint, response.num_records, response.stream_window)

    def __str__(self) -> str:
        window = f", stream window {self.stream_window}" if self.stream_window else ""
        return f"fingerprint {self.fingerprint[:12]}, {self.num_records} records{window}"


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """A target's answer to the handshake: the identity it serves, or why it cannot serve."""

    target: Target
    identity: Identity | None
    refusal: WorkerError | None = None
    limit: int = 0  # the most requests it takes from this client at once (0: it did not say)

    def __str__(self) -> str:
        return str(self.identity) if self.identity is not None else str(self.refusal)


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """The identity a loader binds to, the answers of the targets that serve it and those of
    the targets left out."""

    identity: Identity
    chosen: list[Answer]
    left_out: list[Answer]

    def why_left_out(self, answer: Answer) -> str:
        """What `answer` said that left its target out, for logs and `LoaderStats.left_out`."""
        if answer.identity is None:
            return str(answer.refusal)
        return f"another pipeline identity: {answer.identity}; the loader's is {self.identity}"


def handshake_request(pipeline: str, plan: Plan) -> wire.HandshakeRequest:
    return wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(plan)
    )


def ask(target: Target, request: wire.HandshakeRequest, timeout: float) -> Answer:
    """`target`'s answer to the handshake within `timeout` seconds; an error other than a
    refusal in `LEAVES_OUT` raises."""
    try:
        response = target.handshake(request, timeout)
    except WorkerError as error:
        if error.code not in LEAVES_OUT:
            raise
        return Answer(target, None, error)
    if not compatible_versions(response.library_version, loadax.__version__):
        refusal = WorkerError(
            "FAILED_PRECONDITION",
            f"{target.name} runs loadax {response.library_version}, this client "
            f"{loadax.__version__}: major and minor versions must match",
        )
        return Answer(target, None, refusal)
    return Answer(target, Identity.of(response), limit=response.max_in_flight_per_client)


def choose(answers: Sequence[Answer], pipeline: str) -> Choice:
    """The identity the most `answers` agree on (a tie goes to the one answered first), or the
    error of a lone target, or a `WorkerError` naming every target and its refusal."""
    served = [answer.identity for answer in answers if answer.identity is not None]
    counts = collections.Counter(served)
    if not counts:
        refusals = [answer.refusal for answer in answers if answer.refusal is not None]
        if len(refusals) == 1:
            raise refusals[0]
        codes = {refusal.code for refusal in refusals}
        raise WorkerError(
            codes.pop() if len(codes) == 1 else "FAILED_PRECONDITION",
            f"no target serves pipeline {pipeline!r} to this client: "
            + "; ".join(f"{answer.target.name} answered {answer}" for answer in answers),
        )
    # A Counter keeps first-answered order, and max() returns the first of equals.
    identity = max(counts, key=counts.__getitem__)
    return Choice(
        identity,
        [answer for answer in answers if answer.identity == identity],
        [answer for answer in answers if answer.identity != identity],
    )


def require(answer: Answer, expected: Identity, pipeline: str) -> None:
    """Refuse a target joining a loader bound to `expected`: its refusal, or a ValueError naming
    both identities."""
    if answer.refusal is not None:
        raise answer.refusal
    if answer.identity != expected:
        raise ValueError(
            f"{answer.target.name} serves pipeline {pipeline!r} with {answer.identity}, the "
            f"loader's workers with {expected}"
        )
