"""The one decision loop per loader, which owns its fleet policy: it drains one inbox of events
(answers from transports, new requests, members joining and leaving) in order, applies each to
the policy at the time it reads from the clock, and carries out the actions the policy returns.

It is the only place that changes fleet state and the only reader of the clock for it; the
training thread only takes finished batches. Replies are verified once, here, on the thread that
received them (`ReplyDecoder.verify`), before the policy hears of them: a bad reply is the failure
of its member, whatever the transport.

Its thread wakes at the policy's next deadline (`Policy.wake_at`) and for events, but not for a
request the policy would only queue (`Policy.admits`): the next pass takes it. An answer is
applied on the thread that received it (an I/O thread, a local member's) when the driver's thread
has nothing to do: one pass at a time owns the policy (`_passing`), the same code on any thread.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future
from typing import Any

from loadax.client.connectors import Connectors
from loadax.client.demand import MemberRates
from loadax.client.fleet_events import (
    Action,
    Answered,
    Cancel,
    Connect,
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
    Send,
    Submit,
    Tick,
    Unreachable,
    Withdraw,
)
from loadax.client.fleet_options import FleetOptions
from loadax.client.fleet_watch import FleetWatch, is_local
from loadax.client.inbox import Inbox
from loadax.client.member import Member
from loadax.client.policy import Policy
from loadax.client.recorded import Recorded
from loadax.client.subset import Seat
from loadax.client.transports import Reply
from loadax.errors import WorkerError
from loadax.iterators.stats import WorkerStats
from loadax.logfields import fields
from loadax.reuse import ReuseCounts
from loadax.wire.plans import request_digest
from loadax.wire.v1 import worker_pb2 as wire

_log = logging.getLogger("loadax.client")


@dataclasses.dataclass(frozen=True, slots=True)
class _Change:
    """A member joining or leaving; `applied` is set once the policy knows."""

    item: Member | Left
    applied: threading.Event


@dataclasses.dataclass(frozen=True, slots=True)
class _Submitted:
    request: int
    step: int
    make: Callable[[], wire.BatchRequest]
    batch: Future[Any]


class Driver:
    """Runs `Policy(options, seat)` on a thread of its own; `close()` stops it and closes every
    member. `connect(name)` connects a listed member (the member, or an error saying why not),
    on a thread of its own. With `record` a list, each step (time, event, actions) is appended
    to it."""

    def __init__(
        self,
        options: FleetOptions,
        *,
        seat: Seat | None = None,
        connect: Callable[[str], Member] | None = None,
        record: list[Recorded] | None = None,
    ) -> None:
        self.options = options
        self._policy = Policy(options, seat)
        self._connectors = (
            None if connect is None else Connectors(connect, self._joined, self._unreached)
        )
        self._closed = False
        self._record = record
        self._inbox = Inbox()
        self._stopping = False
        self._admits = True  # whether the policy admits a request now (read without a lock)
        # Held by the pass that owns the policy, on the driver's thread or an answering one.
        self._passing = threading.Lock()
        self._wake: float | None = None  # the policy's next deadline
        self._asleep_until: float | None = None  # when the driver's thread wakes (None: never)
        # Guards the policy for the readers on other threads (members, depth, stats).
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # Owned by the pass that holds `_passing`, on whichever thread.
        self._members: dict[str, Member] = {}
        self._requests: dict[int, tuple[wire.BatchRequest, Future[Any]]] = {}
        self._attempts: dict[int, Future[Reply]] = {}
        self._watch = FleetWatch()
        self.rates = MemberRates()
        """Each member's batches per second while busy (for `stats().workers_wanted`)."""
        # Written by the threads that receive answers, read by the driver's after their event.
        self._answers: dict[int, Any] = {}
        self.reuse = ReuseCounts()
        """The verified replies by how their workers came by them (computed, shared)."""
        self._thread = threading.Thread(target=self._run, name="loadax-driver", daemon=True)
        self._thread.start()

    # What other threads call.

    def submit(self, step: int, make: Callable[[], wire.BatchRequest]) -> Future[Any]:
        """A future of the batch that the request `make()` (made on the driver's thread) asks
        for; cancelling it withdraws the request."""
        batch: Future[Any] = Future()
        request = next(self._ids)
        submitted = _Submitted(request, step, make, batch)
        # Unless admitted, it waits for an answer or a deadline, which wake the driver.
        (self._inbox.post if self._admits else self._inbox.put)(submitted)
        batch.add_done_callback(functools.partial(self._withdrawn, request))
        return batch

    def join(self, member: Member) -> None:
        """Use `member`, which serves the loader's identity (in `members` on return); a
        ValueError if a member of its name is in use."""
        if member.name in self.members:
            raise ValueError(f"{member.name} is a target already")
        self._change(member)

    def leave(self, name: str) -> None:
        """Stop using member `name`; what it held is re-issued to the others."""
        self._change(Left(name))

    @property
    def same_host(self) -> bool:
        """Whether a worker on this host is connected (`client.host_cores`)."""
        return any(member.same_host for member in list(self._members.values()))

    @property
    def same_host_slots(self) -> int:
        """The cores workers on this host keep while they answer (`client.host_cores`)."""
        with self._lock:
            return self._policy.host.kept()

    @property
    def off_host(self) -> bool:
        """Whether a worker on another host is connected (`client.spare_cores`)."""
        members = list(self._members.values())
        return any(not (member.same_host or is_local(member.name)) for member in members)

    def local_cores(self, cores: int, usable: int) -> None:
        """The local members hold `cores` of this host's `usable` ones (`client.host_cores`)."""
        self._inbox.post(LocalCores(cores, usable))

    def enlist(self, name: str) -> None:
        """Member `name` is in the fleet: the policy connects it when its aperture reaches it
        (through `connect`)."""
        if self._connectors is None:
            raise ValueError("this driver cannot connect members: it was made without connect")
        self._inbox.post(Listed(name))

    def _change(self, item: Member | Left) -> None:
        applied = threading.Event()
        self._inbox.post(_Change(item, applied))
        while not applied.wait(0.1):
            if not self._thread.is_alive():
                return  # closed: nothing to change

    @property
    def members(self) -> list[str]:
        """The members connected."""
        with self._lock:
            return self._policy.members

    @property
    def known(self) -> list[str]:
        """Every member, connected or listed."""
        with self._lock:
            return self._policy.known

    def depth(self) -> int:
        with self._lock:
            return self._policy.depth(time.monotonic())

    def member_stats(self) -> dict[str, WorkerStats]:
        with self._lock:
            return self._policy.member_stats()

    def close(self) -> None:
        self._stopping = True
        self._inbox.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # The driver's thread.

    def _run(self) -> None:
        try:
            while True:
                self._inbox.wait(self._asleep_until)  # one pass for every wake-up waiting
                if self._stopping:
                    return
                with self._passing:
                    self._pass()
                    self._asleep_until = self._wake
        except Exception:  # a bug: every request waiting would hang without this
            _log.exception("the fleet driver failed", extra=fields(event="driver_failed"))
            raise
        finally:
            with self._passing:
                self._shut_down()

    def _pass(self) -> None:
        """Apply every item in the inbox to the policy, in order, with a `Tick` if its deadline
        came, and carry out what it decides; again while requests it would admit came meanwhile.
        The caller holds `_passing`."""
        while True:
            items = self._inbox.take()
            now = time.monotonic()
            events = [event for event in map(self._accept, items) if event is not None]
            if self._wake is not None and now >= self._wake:
                events.append(Tick())
            actions: list[Action] = []
            with self._lock:
                for event in events:
                    decided = self._policy.decide(event, now)
                    if self._record is not None:
                        self._record.append((now, event, decided))
                    actions += decided
                self._wake = self._policy.wake_at(now)
                self._admits = self._policy.admits(now)
            for action in actions:
                self._carry_out(action)
            self._applied(items, events)
            if not (self._inbox and self._admits):
                return

    def _applied(self, items: Iterable[Any], events: Iterable[Event]) -> None:
        """What the driver does once `events` (of `items`) are applied and acted on."""
        for item in items:
            if isinstance(item, _Change):
                item.applied.set()
        for event in events:
            if isinstance(event, Answered):  # resolved by now, or late: not kept
                self._answers.pop(event.attempt, None)
            elif isinstance(event, Withdraw):
                self._requests.pop(event.request, None)
            elif isinstance(event, Left):
                left = self._members.pop(event.member, None)
                if left is not None:
                    left.transport.close()

    def _accept(self, item: Any) -> Event | None:
        """The policy's event for a queued item; the driver keeps what the policy does not see."""
        if isinstance(item, _Submitted):
            made = item.make()
            self._requests[item.request] = (made, item.batch)
            digest = request_digest(made) if self.options.affinity is True else b""
            return Submit(item.request, item.step, digest)
        if isinstance(item, _Change):
            if isinstance(item.item, Left):
                self._departed(item.item.member)
                return item.item
            if item.item.name in self._members:  # joined twice at once: the first one stays
                item.item.transport.close()
                return None
            joined = self._members[item.item.name] = item.item
            return Joined(joined.name, joined.limit, joined.same_host, joined.slots)
        if isinstance(item, Answered | Failed):
            self._attempts.pop(item.attempt, None)
            answered = isinstance(item, Answered)
            now = time.monotonic()
            rates = self.rates
            member = rates.answered(item.attempt, now) if answered else rates.dropped(item.attempt)
            if member is not None:
                self._watch.outcome(member, answered, list(self._members))
        return item  # type: ignore[no-any-return]

    def _departed(self, member: str) -> None:
        self.rates.left(member)
        self._watch.left(member, [name for name in self._members if name != member])

    def _carry_out(self, action: Action) -> None:
        if isinstance(action, Send):
            self._send(action)
        elif isinstance(action, Cancel):
            attempt = self._attempts.pop(action.attempt, None)
            self.rates.dropped(action.attempt)
            if attempt is not None:
                attempt.cancel()
        elif isinstance(action, Resolve):
            _, batch = self._requests.pop(action.request)
            if batch.set_running_or_notify_cancel():
                batch.set_result(self._answers.pop(action.attempt))
        elif isinstance(action, Fail):
            _, batch = self._requests.pop(action.request)
            if batch.set_running_or_notify_cancel():
                batch.set_exception(action.error)
        elif isinstance(action, Note):
            _log.log(action.level, "%s", action.message, extra=dict(action.facts))
        elif isinstance(action, Connect):
            assert self._connectors is not None, "the policy connects only members enlisted"
            self._connectors.connect(action.member)
        elif isinstance(action, Disconnect):
            self._members.pop(action.member).transport.close()
            self._departed(action.member)

    def _joined(self, member: Member) -> None:
        self._inbox.post(_Change(member, threading.Event()))

    def _unreached(self, name: str, error: str) -> None:
        self._inbox.post(Unreachable(name, error))

    def _send(self, action: Send) -> None:
        member = self._members[action.member]
        request, _ = self._requests[action.request]
        try:
            sent = member.transport.send(request)
        except Exception as error:  # e.g. closed as it was chosen: a failed attempt
            self._inbox.post(
                Failed(
                    action.attempt,
                    WorkerError("UNAVAILABLE", f"{member.name} could not be asked: {error}"),
                )
            )
            return
        self._attempts[action.attempt] = sent
        self.rates.sent(member.name, action.attempt, time.monotonic())
        sent.add_done_callback(functools.partial(self._received, action.attempt, member, request))

    def _received(
        self, attempt: int, member: Member, request: wire.BatchRequest, reply: Future[Reply]
    ) -> None:
        """On the thread that received the reply: verified, then told to the policy."""
        try:
            batch = member.replies.verify(request, reply)
        except CancelledError:
            return  # the policy cancelled it
        except BaseException as error:
            self._inbox.post(Failed(attempt, error))
            return
        self._answers[attempt] = batch
        header = reply.result().header
        self.reuse.replied(header)
        answered = Answered(attempt, header.load, header.loading_slots)
        # Applied here when nothing else waits, so that the driver's thread is not woken to
        # hand the batch over.
        if not (self._inbox.quiet() and self._passing.acquire(False)):
            self._inbox.post(answered)
            return
        try:
            if self._closed:
                return
            self._inbox.put(answered)
            self._pass()
            wake, asleep_until = self._wake, self._asleep_until
            if wake is not None and (asleep_until is None or wake < asleep_until):
                self._inbox.wake()  # a deadline before the driver's thread wakes
        except Exception:  # a bug: the driver stops, failing every request, as on its thread
            _log.exception("the fleet driver failed", extra=fields(event="driver_failed"))
            self._stopping = True
            self._inbox.wake()
        finally:
            self._passing.release()

    def _withdrawn(self, request: int, batch: Future[Any]) -> None:
        if batch.cancelled():
            self._inbox.post(Withdraw(request))

    def _shut_down(self) -> None:
        self._closed = True
        if self._connectors is not None:
            self._connectors.close()
        for attempt in self._attempts.values():
            attempt.cancel()
        for _, batch in self._requests.values():
            batch.cancel()
        for member in self._members.values():
            member.transport.close()
        self._members.clear()
