"""A fleet member: one worker, the transport that reaches it and what it answered the handshake
(the pipeline identity it serves, or why it cannot serve this loader)."""

from __future__ import annotations

import dataclasses

import loadax
from loadax.client.replies import ReplyDecoder
from loadax.client.transports import Transport
from loadax.errors import WorkerError
from loadax.plan.planner import Plan
from loadax.wire.plans import compatible_versions, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

LEAVES_OUT = frozenset({"NOT_FOUND", "FAILED_PRECONDITION"})
"""Handshake refusals that leave one member out: no such pipeline, an incompatible version. Any
other error (an unreachable worker, a plan the worker rejects) is raised."""


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """What a loader binds to: the pipeline's fingerprint (a digest of its code and of a probe
    batch: `loadax.identity`), its number of records and its stream window (0: not a stream).

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


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Member:
    """A worker reached by `transport`, whose replies `replies` verifies against the schema of
    its handshake; the identity it serves (None: `refusal` says why it cannot serve), the
    most requests it takes from this client at once (`limit`, 0: it did not say), whether it
    runs on this host (`same_host`: it took the handshake's shared-memory probe) and the batches
    it loads at once (`slots`, its threads; 0: it did not say)."""

    transport: Transport
    replies: ReplyDecoder
    identity: Identity | None
    refusal: WorkerError | None = None
    limit: int = 0
    same_host: bool = False
    slots: int = 0

    @classmethod
    def refused(cls, transport: Transport, refusal: WorkerError) -> Member:
        """The worker `transport` reaches, which cannot serve this loader."""
        return cls(transport, ReplyDecoder(transport.name), None, refusal)

    @property
    def name(self) -> str:
        return self.transport.name

    def __str__(self) -> str:
        return str(self.identity) if self.identity is not None else str(self.refusal)


def handshake_request(pipeline: str, plan: Plan) -> wire.HandshakeRequest:
    return wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(plan)
    )


def ask(transport: Transport, request: wire.HandshakeRequest, timeout: float) -> Member:
    """The member `transport` reaches, by its answer to the handshake within `timeout` seconds;
    an error other than a refusal in `LEAVES_OUT` raises."""
    replies = ReplyDecoder(transport.name)
    try:
        response = replies.learn(transport.handshake(request, timeout))
    except WorkerError as error:
        if error.code not in LEAVES_OUT:
            raise
        return Member(transport, replies, None, error)
    if not compatible_versions(response.library_version, loadax.__version__):
        refusal = WorkerError(
            "FAILED_PRECONDITION",
            f"{transport.name} runs loadax {response.library_version}, this client "
            f"{loadax.__version__}: major and minor versions must match",
        )
        return Member(transport, replies, None, refusal)
    identity = Identity.of(response)
    limit, same_host = response.max_in_flight_per_client, response.shared_memory
    slots = response.loading_slots
    return Member(transport, replies, identity, limit=limit, same_host=same_host, slots=slots)
