"""The requests a policy holds (`Outstanding`): those waiting beyond its depth, those admitted
(outstanding, in step order) and the attempts out for each. Pure state: the policy decides
(`loadax.client.policy`), this keeps the books."""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque

from loadax.client.fleet_events import Action, Cancel, Fail, Send
from loadax.client.member_health import MemberHealth
from loadax.errors import WorkerError


@dataclasses.dataclass(eq=False)
class Attempt:
    """One request sent to one member."""

    request: Request
    member: MemberHealth
    sent: float
    given_up: bool = False  # judged hung: it may still answer, and wins if first


@dataclasses.dataclass(eq=False)
class Request:
    """One batch the loader asked for."""

    id: int
    step: int
    started: float = 0.0  # when it was admitted
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)  # member -> attempt
    failing_since: float | None = None
    poisoned: list[str] = dataclasses.field(default_factory=list)  # members that said poison
    code_failed: list[str] = dataclasses.field(default_factory=list)  # ... whose pipeline raised
    digest: bytes = b""  # what it asks for: requests that ask alike meet at one member


class Outstanding:
    """Requests waiting and admitted, and their attempts by id."""

    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()  # submitted, beyond the depth
        self.admitted: dict[int, Request] = {}  # outstanding, in step order
        self.attempts: dict[int, Attempt] = {}
        self._ids = itertools.count(1)

    def admit(self, now: float) -> Request:
        """The first request waiting, admitted at `now`."""
        request = self.waiting.popleft()
        request.started = now
        self.admitted[request.id] = request
        return request

    def withdraw(self, request_id: int) -> Request | None:
        """Forget request `request_id` if it is waiting; the admitted one, for the policy to
        finish (None: neither)."""
        for waiting in self.waiting:
            if waiting.id == request_id:
                self.waiting.remove(waiting)
                return None
        return self.admitted.get(request_id)

    def send(self, request: Request, member: MemberHealth, now: float) -> Send:
        """A new attempt of `request` to `member`."""
        attempt_id = next(self._ids)
        self.attempts[attempt_id] = Attempt(request, member, now)
        request.attempts[member.name] = attempt_id
        member.send(attempt_id, now)
        return Send(attempt_id, request.id, member.name)

    def finish(self, request: Request, now: float) -> list[Cancel]:
        """`request` is over: its attempts still out are cancelled, and each one's member is
        at least as slow as its age."""
        del self.admitted[request.id]
        cancels = []
        for attempt_id in request.attempts.values():
            attempt = self.attempts.pop(attempt_id, None)
            if attempt is not None:
                attempt.member.abandoned(attempt_id, now)
                cancels.append(Cancel(attempt_id))
        return cancels

    def fail_all(self, error: WorkerError, now: float) -> list[Action]:
        """Every request admitted or waiting fails with `error` (its attempts cancelled)."""
        actions: list[Action] = []
        for admitted in list(self.admitted.values()):
            actions += self.finish(admitted, now)
            actions.append(Fail(admitted.id, error))
        actions += [Fail(waiting.id, error) for waiting in self.waiting]
        self.waiting.clear()
        return actions

    def settle(self, attempt_id: int) -> Attempt | None:
        """Attempt `attempt_id` came back: no longer out (None: it was cancelled, or its
        member left)."""
        attempt = self.attempts.pop(attempt_id, None)
        if attempt is not None:
            del attempt.request.attempts[attempt.member.name]
        return attempt

    def left(self, member: MemberHealth) -> list[Request]:
        """`member` left: its attempts are forgotten; the requests with none left live, to send
        again."""
        orphans = []
        for attempt_id in list(member.sent):
            attempt = self.settle(attempt_id)
            if attempt is not None and self.none_live(attempt.request):
                orphans.append(attempt.request)
        return orphans

    def live(self, request: Request) -> list[Attempt]:
        """`request`'s attempts out, given up or not."""
        return [self.attempts[attempt] for attempt in request.attempts.values()]

    def none_live(self, request: Request) -> bool:
        """Whether every attempt of `request` still out (if any) was given up as hung."""
        return all(self.attempts[other].given_up for other in request.attempts.values())
