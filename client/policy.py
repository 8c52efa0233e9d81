"""The fleet's placement policy: which member gets each request, hedges, hangs, back-off,
quarantine and give-ups, as one state changed only by `Policy.decide(event, now) -> actions`.

It holds no threads, locks, futures or clocks: time comes in as `now` (seconds), so the same
code runs under the loader's driver, in tests on a virtual clock and in simulations. A batch is
a pure function of (pipeline, plan, step, rows), so placement may follow load without changing
a byte. The rules:

- Subset: requests go to the members of the client's aperture (`loadax.client.aperture`), an
  arc of the fleet's ring sized to its demand and share, connected while in it; when no member
  of the arc is free, any connected member. Same-host workers may be passed over (`host_cores`).
- Depth: requests are admitted in order while fewer than `in_flight_per_worker` per member of
  the aperture that is up (within its limit) are outstanding, at least one.
- Each attempt goes to the least loaded of the members expected to answer soon (`member_choice`),
  within what each announced it takes; RESOURCE_EXHAUSTED is back-pressure (that member is sent
  less for a while), not a failure.
- Tails (`loadax.client.tails`): the oldest requests are hedged, hung attempts are given up and
  re-issued, within a share of extra attempts. A member given up `HUNG_STRIKES` times in a row
  is quarantined.
- A failed attempt is re-issued elsewhere at once and its member backs off, doubling; a member
  wrong for this loader (another identity, no such pipeline, a bad reply) is quarantined, and
  probed with one real request after a doubling back-off; an answer releases it.
- Work that killed or stalled a worker's process (poison) is asked of at most `poison_retries`
  other members; then the request fails with `PoisonedRecords`.
- A batch the pipeline's own code fails to make (collation, the batcher) is asked of one other
  member, if there is one, to confirm; then the training loop gets the exception the local
  loader raises. Neither member is counted as failing.
- A member that has not answered yet is cold (starting processes, importing, faulting in its
  first batch): its attempt given up as hung is re-issued elsewhere, but never held against it
  (no back-off, no strike towards quarantine); it may still answer, and then it is warm.
- A fleet that has answered nothing for `no_worker_timeout` while it had requests is dead: every
  request outstanding or waiting fails at once, naming each member and its last error. While
  every member is failing, a warning says so at once and then every 10 s (`FailingWarnings`).
- A request every member has been failing for `no_worker_timeout` fails alone. When every
  member serves another pipeline identity (a rolling update), every request fails at once.
"""

from __future__ import annotations

import logging
import math

from loadax.client import fleet_failures
from loadax.client.aperture import Aperture
from loadax.client.fleet_events import (
    Action,
    Answered,
    Disconnect,
    Event,
    Fail,
    Failed,
    Joined,
    Left,
    Listed,
    LocalCores,
    Note,
    Resolve,
    Submit,
    Tick,
    Unreachable,
    Withdraw,
)
from loadax.client.fleet_options import FleetOptions
from loadax.client.host_cores import HostCores
from loadax.client.member_choice import choose
from loadax.client.member_health import FleetLatency, MemberHealth
from loadax.client.outstanding import Attempt, Outstanding, Request
from loadax.client.subset import Seat
from loadax.client.tails import ExtraShare, due_at, front, overdue, resend, thresholds
from loadax.client.verdicts import Verdict, serves_another, verdict
from loadax.iterators.stats import WorkerStats
from loadax.logfields import Value, fields
from loadax.wire.failures import PipelineFailed, PoisonFailed

DEFAULT_LIMIT = 16
"""The most requests a member is sent at once when it did not announce its own limit."""
TICK = 0.02
"""The fewest seconds between ticks: their pace while something waits on time alone."""


class Policy:
    """The fleet's state and rules (see the module). Not thread-safe: one owner calls `decide`.

    >>> from loadax.client.fleet_events import Answered, Joined, Submit
    >>> policy = Policy(FleetOptions())
    >>> policy.decide(Joined("a", limit=4), now=0.0)
    []
    >>> policy.decide(Submit(request=1, step=0), now=0.0)
    [Send(attempt=1, request=1, member='a')]
    >>> policy.decide(Answered(attempt=1), now=0.5)
    [Resolve(request=1, attempt=1)]
    """

    def __init__(self, options: FleetOptions, seat: Seat | None = None) -> None:
        self.options = options
        self.seat = seat or Seat()
        self._members: dict[str, MemberHealth] = {}  # connected
        self._aperture = Aperture(options, self.seat)
        self.host = HostCores(self._members)  # who makes batches on the trainer's host
        self._requests = Outstanding()
        self._latency = FleetLatency()
        self._extra = ExtraShare()
        self._answered_at = 0.0  # when the fleet last answered, joined or was last idle
        self._failing = fleet_failures.FailingWarnings()
        self._actions: list[Action] = []
        self._now = 0.0  # the time of the event being applied
        self._ticked_at = -math.inf  # when the last Tick came

    # What others read.

    @property
    def members(self) -> list[str]:
        """The members connected."""
        return list(self._members)

    @property
    def known(self) -> list[str]:
        """Every member, connected or listed."""
        return list(self._aperture.ring)

    @property
    def aperture(self) -> dict[str, float]:
        """The members requests go to, each with its share of the arc (see the module)."""
        return dict(self._aperture.active)

    def depth(self, now: float) -> int:
        """How many requests to keep outstanding (`Aperture.depth`)."""
        return self._aperture.depth(self.host.in_use(now), now)

    def admits(self, now: float) -> bool:
        """Whether a request submitted at `now` is admitted at once (else it waits)."""
        requests = self._requests
        return not requests.waiting and len(requests.admitted) < self.depth(now)

    def wake_at(self, now: float) -> float | None:
        """When the policy next wants a `Tick` (None: not until another event): at its first
        deadline (a hang, a hedge, the fleet's silence, a back-off's end), at the `TICK` pace
        while something waits on time alone (a request with no live attempt, a member failing)."""
        requests, members = self._requests, self._members.values()
        if not (requests.admitted or requests.waiting):
            return None
        silent_at = self._answered_at + self.options.no_worker_timeout
        hung, hedge = thresholds(self._latency, self.options)
        ends = [member.down_until for member in members if member.down_until > now]
        due = min(silent_at, due_at(requests, hung, hedge), *ends)
        if self._aperture.due(now) or any(m.failing or m.quarantined is not None for m in members):
            due = -math.inf
        return max(due, self._ticked_at + TICK, now)

    def member_stats(self) -> dict[str, WorkerStats]:
        return {name: member.stats() for name, member in self._members.items()}

    # The one door.

    def decide(self, event: Event, now: float) -> list[Action]:
        """Apply `event`, which happened at `now`; what the driver must do about it."""
        self._actions, self._now = [], now
        if isinstance(event, Submit):
            self._requests.waiting.append(Request(event.request, event.step, digest=event.digest))
        elif isinstance(event, Withdraw):
            if (admitted := self._requests.withdraw(event.request)) is not None:
                self._finish(admitted, None)
        elif isinstance(event, Answered | Failed):
            self._settle(event, now)
        elif isinstance(event, Tick):
            self._tick(now)
        elif isinstance(event, Joined):
            self._joined(event, now)
        elif isinstance(event, Listed):
            if event.member not in self._members:
                self._aperture.listed(event.member)
        elif isinstance(event, Unreachable):
            self._unreached(event, now)
        elif isinstance(event, Left):
            self._leave(event.member, now)
        elif isinstance(event, LocalCores):
            self._actions += self.host.held(event.cores, event.usable)
        # Not at each member listed: a fleet is listed one member at a time.
        if self._aperture.due(now) and not isinstance(event, Listed):
            self._reshape(now)
        self._admit(now)
        return self._actions

    # Requests.

    def _admit(self, now: float) -> None:
        requests = self._requests
        if not requests.waiting:
            return  # nothing to admit: the depth (a look at every member) is not needed
        if not requests.admitted:  # idle until now: silence counts from here
            self._answered_at = max(self._answered_at, now)
        depth = self.depth(now)
        while requests.waiting and len(requests.admitted) < depth:
            self._dispatch(requests.admit(now), now)

    def _finish(self, request: Request, outcome: Resolve | Fail | None) -> None:
        """`request` is over (`outcome` None: withdrawn); its other attempts are cancelled."""
        self._actions += self._requests.finish(request, self._now)
        if outcome is not None:
            self._actions.append(outcome)
            if isinstance(outcome, Resolve):
                self._aperture.resolved()

    def _dispatch(self, request: Request, now: float, extra: bool = False) -> None:
        """Send an attempt to the best member free for it; an `extra` one only within the share
        of extra attempts."""
        if self._gave_up(request, now):
            return
        if extra and not self._extra.left:
            return
        if request.poisoned and (
            len(request.poisoned) + len(request.attempts) > self.options.poison_retries
        ):
            return  # as many members as may have it are trying it, or have failed it
        busy = set(request.attempts)
        # Another member, if there is one, when one has failed it as poison or in its code.
        member = self._choose(busy | set(request.poisoned) | set(request.code_failed), now, request)
        if member is None and request.poisoned:
            member = self._choose(busy, now, request)
        if member is None:
            return  # the next tick tries again
        if extra:
            self._extra.spend()
        self._actions.append(self._requests.send(request, member, now))

    def _choose(self, busy: set[str], now: float, request: Request) -> MemberHealth | None:
        """The free member chosen (`member_choice.choose`) of the aperture, else any, not busy."""
        hedge = not self._requests.none_live(request)  # another attempt of it is live
        busy = busy | self.host.kept_off(busy, now, hedge)
        shares = self._aperture.active
        members = [
            member
            for member in map(self._members.get, shares)
            if member is not None and member.name not in busy and member.free(now)
        ]
        if not members:
            shares = {}
            members = [m for m in self._members.values() if m.name not in busy and m.free(now)]
        if not members:
            return None
        return choose(members, shares, now, request.digest)

    def _gave_up(self, request: Request, now: float) -> bool:
        """Whether `request` failed, alone or with every other (`fleet_failures.given_up`)."""
        silent_s, limit = now - self._answered_at, self.options.no_worker_timeout
        failing_s = None if request.failing_since is None else now - request.failing_since
        verdict = fleet_failures.given_up(
            request.step, silent_s, failing_s, limit, self._members.values()
        )
        if verdict is None:
            return False
        error, every = verdict
        if every:
            self._actions += self._requests.fail_all(error, now)  # the fleet cannot serve
        else:
            self._finish(request, Fail(request.id, error))
        return True

    # Answers.

    def _settle(self, event: Answered | Failed, now: float) -> None:
        attempt = self._requests.settle(event.attempt)
        if attempt is None:
            return  # cancelled, or its member left: the request does not wait for it
        request, member = attempt.request, attempt.member
        if isinstance(event, Answered):
            self._answered_at = now
            self._aperture.answered(member.name)
            self._latency.add(now - attempt.sent)
            member.loaded(event.load, event.loading_slots, now)
            if member.answered(event.attempt, now):
                self._note(
                    logging.INFO,
                    f"{member.name} answered again: out of quarantine",
                    fields(event="released", target=member.name),
                )
            # Even an attempt given up as hung wins if it answers first.
            self._finish(request, Resolve(request.id, event.attempt))
            return
        member.sent.pop(event.attempt)
        self._failed_attempt(request, attempt, event.error, now)

    def _failed_attempt(
        self, request: Request, attempt: Attempt, error: BaseException, now: float
    ) -> None:
        member = attempt.member
        judged = verdict(error)
        if judged is Verdict.FATAL:
            self._finish(request, Fail(request.id, error))
            return
        if isinstance(error, PipelineFailed):
            request.code_failed.append(member.name)
            if len(request.code_failed) > 1 or not set(self._members) - {member.name}:
                self._finish(request, Fail(request.id, error.rebuild(member.name)))
            elif self._requests.none_live(request):
                self._dispatch(request, now)  # to another member, to confirm
            return
        self._note_failure(request, now)
        if isinstance(error, PoisonFailed):
            request.poisoned.append(member.name)
            if len(request.poisoned) > self.options.poison_retries:
                self._finish(request, Fail(request.id, error.rebuild(request.poisoned)))
                return
            self._note(
                logging.WARNING,
                f"{member.name} answered: {error.message}",
                fields(event="poison", target=member.name, step=request.step, error=error.message),
            )
        if judged is Verdict.QUARANTINE:
            entered = member.quarantine(str(error), now, wrong=serves_another(error))
            self._actions += fleet_failures.entering(member, entered)
            if all(other.wrong for other in self._members.values()):
                replaced = fleet_failures.serving_another(self._members.values())
                self._actions += self._requests.fail_all(replaced, now)
                return
        elif judged is Verdict.PRESSURE:
            member.pressed(str(error), now)
        elif not attempt.given_up:  # a given-up attempt was counted when given up
            member.back_off(str(error), now)
        if self._requests.none_live(request):
            self._dispatch(request, now)  # at once: only this member is kept off

    def _note_failure(self, request: Request, now: float) -> None:
        if request.failing_since is None:
            request.failing_since = now

    # Members.

    def _joined(self, event: Joined, now: float) -> None:
        name = event.member
        if name in self._members:
            return
        self._aperture.joined(name)
        if not self._members:
            self._answered_at = now
        limit = event.limit or DEFAULT_LIMIT
        self._members[name] = MemberHealth(name, limit, self.options, event.same_host, event.slots)

    def _unreached(self, event: Unreachable, now: float) -> None:
        """A connect failed: the member stays listed, tried again after a back-off."""
        if self._aperture.unreached(event.member, now):
            self._note(
                logging.WARNING,
                f"{event.member} could not be connected: {event.error}",
                fields(event="unreachable", target=event.member, error=event.error),
            )

    def _reshape(self, now: float) -> None:
        """Resize the aperture; connect and disconnect as it says."""
        for change in self._aperture.reshape(now, self._members, self._latency.p50):
            if isinstance(change, Disconnect):
                del self._members[change.member]
            self._actions.append(change)

    def _leave(self, name: str, now: float) -> None:
        self._aperture.left(name)
        member = self._members.pop(name, None)
        if member is None:
            return
        for request in self._requests.left(member):
            self._dispatch(request, now)

    # Time.

    def _tick(self, now: float) -> None:
        self._ticked_at = now
        self._extra.earn(now, self._aperture.rate)
        self._actions += self._failing.due(
            now,
            bool(self._requests.admitted),
            now - self._answered_at,
            self.options.no_worker_timeout,
            self._members.values(),
        )
        hung, hedge = thresholds(self._latency, self.options)
        requests = list(self._requests.admitted.values())
        hedged = front(requests)
        for request in requests:
            if request.id in self._requests.admitted:
                self._check(request, now, hung, hedge if request in hedged else None)

    def _check(self, request: Request, now: float, hung: float, hedge: float | None) -> None:
        """Give up hung attempts, re-issue or hedge the request, or fail it."""
        if self._gave_up(request, now):
            return
        attempts = self._requests.live(request)
        for attempt in overdue(attempts, now, hung):
            attempt.given_up = True
            self._note_failure(request, now)
            if attempt.member.warm_at(attempt.sent):  # one sent cold is not held against it
                age = now - attempt.sent
                error = f"no answer within {hung:.3g} s (after {age:.3g} s)"
                entered = attempt.member.hung(error, now)
                self._actions += fleet_failures.entering(attempt.member, entered)
        extra = resend(attempts, now, hedge, self.options.request_timeout)
        if extra is not None:
            self._dispatch(request, now, extra=extra)

    def _note(self, level: int, message: str, facts: dict[str, Value]) -> None:
        self._actions.append(Note(level, message, facts))
