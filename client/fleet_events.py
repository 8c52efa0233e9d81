"""What the fleet's policy is told (events) and what it decides (actions).

Requests, attempts and members are named by plain values (ids and names), so that a run's events
can be recorded and replayed: the policy makes the same decisions from the same events and times.
Answers' batches and transports stay with the driver, which looks them up by id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from loadax.logfields import Value

# Events: what happened, told to `Policy.decide` by the driver.


@dataclasses.dataclass(frozen=True, slots=True)
class Submit:
    """A batch request to see through to one answer; `step` names it in messages, `digest`
    what it asks for (`loadax.wire.plans.request_digest`; empty: nothing to meet others on)."""

    request: int
    step: int
    digest: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class Withdraw:
    """The training loop no longer wants `request`'s batch."""

    request: int


@dataclasses.dataclass(frozen=True, slots=True)
class Answered:
    """Attempt `attempt` came back with a batch that passed its checks; its worker's `load` per
    loading slot and its `loading_slots` (0: not told; `loadax.wire.load`)."""

    attempt: int
    load: float = 0.0
    loading_slots: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    """Attempt `attempt` failed with `error` (the worker's, the transport's or the checks')."""

    attempt: int
    error: BaseException


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: hedges, hangs, back-offs and give-ups are due."""


@dataclasses.dataclass(frozen=True, slots=True)
class Joined:
    """Member `member` serves the loader's identity and takes `limit` requests at once (0: it
    did not say); `same_host`: a worker on the trainer's host (found at the handshake), which
    loads `slots` batches at once (0: it did not say)."""

    member: str
    limit: int = 0
    same_host: bool = False
    slots: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Left:
    """Member `member` is no longer used; its attempts are given up."""

    member: str


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """Member `member` is in the fleet but not connected: the policy may `Connect` it."""

    member: str


@dataclasses.dataclass(frozen=True, slots=True)
class Unreachable:
    """A `Connect` of `member` failed with `error`: it stays listed, tried again later."""

    member: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class LocalCores:
    """The local members hold `cores` of the `usable` cores of the trainer's host."""

    cores: int
    usable: int


Event = (
    Submit | Withdraw | Answered | Failed | Tick | Joined | Left | Listed | Unreachable | LocalCores
)

# Actions: what the driver carries out.


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    """Send `request` to `member` as attempt `attempt`."""

    attempt: int
    request: int
    member: str


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Attempt `attempt` is not needed any more."""

    attempt: int


@dataclasses.dataclass(frozen=True, slots=True)
class Resolve:
    """`request`'s batch is the one attempt `attempt` answered."""

    request: int
    attempt: int


@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    """`request` fails with `error`."""

    request: int
    error: BaseException


@dataclasses.dataclass(frozen=True, slots=True)
class Note:
    """Something to log at `level` (a `logging` level), with its `facts` as fields
    (`loadax.logfields`)."""

    level: int
    message: str
    facts: Mapping[str, Value] = dataclasses.field(default_factory=dict, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Connect:
    """Connect listed member `member` and check it serves the loader's identity; then it is
    `Joined`, or `Unreachable`."""

    member: str


@dataclasses.dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the connection to member `member`, which nothing is outstanding on: it is listed
    again."""

    member: str


Action = Send | Cancel | Resolve | Fail | Note | Connect | Disconnect
