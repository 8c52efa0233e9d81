"""Placement and failover for batch requests: which worker gets each request, hedges, deadlines,
re-issue, quarantine, and targets that come and go.

A batch is a pure function of (pipeline, plan, step, rows), so any worker can serve any request
and placement may follow load without changing a byte:

- Each request goes to the worker expected to answer first: the fewest outstanding requests
  times its recent latency (an EWMA, at least the age of its oldest outstanding request). No
  worker holds more than it takes from one client (its `max_in_flight_per_client`, announced at
  the handshake); RESOURCE_EXHAUSTED is back-pressure: that worker is sent less for a while, and
  nothing counts as failed.
- Tails are hidden without tuning: a request that blocks in-order delivery (one of the
  `HEDGED_FRONT` oldest outstanding) is also sent to another worker once it is `HEDGE_FACTOR` x
  the fleet's recent p95 latency old, and an attempt older than `HUNG_FACTOR` x p95 is given up
  as hung (its worker may still answer, and wins if first). Both are measured from when the
  attempt was sent, so the queueing that the latency includes is allowed for, and together they
  add at most `EXTRA_SHARE` of the requests, so they never cascade onto healthy workers. A
  worker given up `HUNG_STRIKES` times in a row is quarantined until a request succeeds on it.
- A request that fails, or lands on a worker that dies, is sent to another worker at once; the
  failed worker backs off. A worker wrong for this loader (another pipeline identity, no such
  pipeline, a reply that fails its checks) is quarantined: kept off for longer, then tried again
  with a real request, so a worker restarted right rejoins.
- When the fleet has answered nothing for `no_worker_timeout` seconds, or every worker has been
  failing a request that long, the request fails naming each worker and its last error.
- Work that killed the worker's process loading it, or ran past its deadline there (poison), is
  asked of at most `poison_retries` other workers; when they fail it so too, the request fails
  with `PoisonedRecords`, naming the work, its rows and records, and those workers.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Literal

from loadax.client.targets import Target
from loadax.client.verdicts import Verdict, verdict
from loadax.errors import WorkerError
from loadax.iterators.stats import StatsRecorder
from loadax.validation import require_int, require_positive
from loadax.wire.failures import PoisonFailed
from loadax.wire.v1 import worker_pb2 as wire

_log = logging.getLogger("loadax.client")

HEDGE_FACTOR = 1.5
"""A request this many times the fleet's p95 latency old is also sent to another worker."""
HUNG_FACTOR = 8.0
"""An attempt this many times the fleet's p95 latency old is given up as hung..."""
HUNG_FLOOR = 1.0
"""... but never one younger than this (seconds): scheduling noise is not a hang."""
HUNG_STRIKES = 3
"""A worker whose attempts are given up this many times in a row is quarantined."""
HEDGED_FRONT = 2
"""The oldest requests outstanding that may be hedged: those that block in-order delivery."""
EXTRA_SHARE = 0.1
"""Hedges and re-issues of hung attempts add at most this share of the requests."""
_EXTRA_BURST = 4.0  # the most extra attempts saved up for a burst of slow requests
LATENCY_SAMPLES = 4
"""Answers the fleet must have given before its latency sets hedges and hang deadlines (until
then an attempt may take `request_timeout` and no request is hedged): few, because a request
that hangs holds up the others' delivery, and so the answers that could be counted."""
_RECENT = 256  # the fleet's answers whose latencies make its p95
_EWMA_WEIGHT = 0.2  # of a worker's newest answer in its latency estimate
_STALE_AFTER = 10.0  # seconds without an answer after which a worker's latency is forgotten
_TICK = 0.02  # seconds between checks of the requests outstanding for hedges and deadlines
DEFAULT_LIMIT = 16
"""The most requests a worker is sent at once when it did not announce its own limit."""


@dataclasses.dataclass(frozen=True, slots=True)
class FleetOptions:
    """How requests are placed and seen through (seconds for times):

    - `request_timeout`: the most one attempt may take; below it, an attempt is given up as hung
      once it is `HUNG_FACTOR` x the fleet's p95 latency old.
    - `hedge_after`: "auto" hedges at `HEDGE_FACTOR` x p95; a number, at that age; None, never.
    - `no_worker_timeout`: how long the fleet may answer nothing before a request fails.
    - `in_flight_per_worker`: requests kept outstanding per healthy worker (within its limit).
    - `memory_budget_mb`: the most batch bytes an iterator holds, outstanding and ready.
    - `startup_timeout`: how long `build()` waits for `min_workers` targets to agree.
    - `poison_retries`: how many more workers are asked work that killed or stalled one.
    - `backoff_*`, `quarantine_*`: how long a failed or a quarantined worker is kept off,
      doubling from the initial value up to the maximum.
    """

    request_timeout: float = 60.0
    hedge_after: float | Literal["auto"] | None = "auto"
    no_worker_timeout: float = 120.0
    in_flight_per_worker: int = 2
    memory_budget_mb: int = 1024
    startup_timeout: float = 30.0
    min_workers: int = 1
    poison_retries: int = 1
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    quarantine_initial: float = 1.0
    quarantine_max: float = 4.0

    def __post_init__(self) -> None:
        for name in (
            "request_timeout",
            "no_worker_timeout",
            "startup_timeout",
            "backoff_initial",
            "backoff_max",
            "quarantine_initial",
            "quarantine_max",
        ):
            require_positive(name, getattr(self, name), unit="seconds")
        if self.hedge_after not in (None, "auto"):
            require_positive("hedge_after", self.hedge_after, unit="seconds")
        for name in ("in_flight_per_worker", "memory_budget_mb", "min_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        require_int("poison_retries", self.poison_retries, minimum=0)


class Scheduler:
    """Runs callbacks at given times on one thread, sleeping on a condition in between."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._queue: list[tuple[float, int, Timer]] = []
        self._counter = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="loadax-dispatch", daemon=True)
        self._thread.start()

    def at(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` in `delay` seconds, unless the returned timer is cancelled first."""
        timer = Timer(callback)
        with self._condition:
            heapq.heappush(self._queue, (time.monotonic() + delay, next(self._counter), timer))
            self._condition.notify()
        return timer

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._stopped and (
                    not self._queue or self._queue[0][0] > time.monotonic()
                ):
                    timeout = self._queue[0][0] - time.monotonic() if self._queue else None
                    self._condition.wait(timeout)
                if self._stopped:
                    return
                _, _, timer = heapq.heappop(self._queue)
            callback, timer.callback = timer.callback, None
            if callback is None:
                continue
            try:
                callback()
            except Exception:  # a bug: logged, and the thread goes on serving the others
                _log.exception("a scheduled callback of the dispatcher failed")


class Timer:
    """A callback the scheduler will run; `cancel()` drops it, and with it what it refers to."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None


@dataclasses.dataclass
class _Member:
    target: Target
    announced: int  # the most requests it takes from one client at once
    limit: int  # what it is sent at most now: lowered by back-pressure, regrown by answers
    outstanding: int = 0
    sent: list[float] = dataclasses.field(default_factory=list)  # its attempts outstanding
    # An EWMA of its answers' latency, raised to the age of any attempt given up unanswered.
    latency: float | None = None
    latency_at: float = 0.0  # when `latency` was last changed
    down_until: float = 0.0
    failures: int = 0  # in a row, since its last answer
    hangs: int = 0  # attempts given up as hung, in a row
    quarantines: int = 0  # in a row, since its last answer
    quarantined: str | None = None  # why, until it answers again
    last_error: str = "none"

    def expected_latency(self, now: float, typical: float) -> float:
        """Its recent latency (`typical` when it has none or it is stale, so that it is tried),
        but at least the age of its oldest attempt outstanding: a worker slow to give its first
        answer is known to be slow before it gives it."""
        latency = typical
        if self.latency is not None and now - self.latency_at <= _STALE_AFTER:
            latency = self.latency
        return max(latency, now - self.sent[0]) if self.sent else latency


class _Latencies:
    """The fleet's recent answers' latencies, and their p95 once there are enough."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=_RECENT)
        self._count = 0
        self._p95: float | None = None

    def add(self, seconds: float) -> None:
        self._recent.append(seconds)
        self._count += 1
        # Every answer while they are few, then every 16th.
        if self._count >= LATENCY_SAMPLES and (self._count < _RECENT or self._count % 16 == 0):
            ordered = sorted(self._recent)
            self._p95 = ordered[int(0.95 * (len(ordered) - 1))]

    @property
    def p95(self) -> float | None:
        return self._p95


class Dispatcher:
    """Sends each batch request to the worker expected to answer first and sees it through to
    one answer; counts each target's requests, failures and latency in `stats`."""

    def __init__(
        self,
        targets: Sequence[Target],
        options: FleetOptions,
        stats: StatsRecorder,
        limits: Sequence[int] | None = None,
    ) -> None:
        self.options = options
        self._stats = stats
        self._lock = threading.Lock()
        self._members: dict[str, _Member] = {}
        for target, limit in zip(targets, limits or [0] * len(targets), strict=True):
            self._members[target.name] = _new_member(target, limit)
        self._scheduler = Scheduler()
        self._latencies = _Latencies()
        self._extra_credit = _EXTRA_BURST
        self._answered_at = time.monotonic()  # when the fleet last answered (or was set up)
        self._requests: set[_Request] = set()
        self._ticking = False

    @property
    def targets(self) -> list[str]:
        with self._lock:
            return list(self._members)

    def add(self, target: Target, limit: int = 0) -> None:
        """Use `target`, which takes `limit` requests at once (0: it did not say)."""
        with self._lock:
            if target.name in self._members:
                raise ValueError(f"{target.name} is a target already")
            self._members[target.name] = _new_member(target, limit)

    def remove(self, name: str) -> None:
        """Stop using a target; what it still held is re-issued to the others."""
        with self._lock:
            member = self._members.pop(name, None)
        if member is None:
            raise ValueError(f"{name} is not a target; targets are {self.targets}")
        self._stats.forget(name)
        member.target.close()

    def depth(self) -> int:
        """How many requests to keep outstanding: `in_flight_per_worker` for each worker that
        is up, within its limit (at least 1, so that requests still find out when none is)."""
        per_worker = self.options.in_flight_per_worker
        now = time.monotonic()
        with self._lock:
            total = sum(
                min(member.limit, per_worker)
                for member in self._members.values()
                if member.quarantined is None and member.down_until <= now
            )
        return max(total, 1)

    def send(self, request: wire.BatchRequest) -> Future[Any]:
        return _Request(self, request).future

    def soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the dispatcher's thread, off the caller's."""
        self._scheduler.at(0.0, callback)

    def close(self) -> None:
        self._scheduler.stop()
        with self._lock:
            members, self._members = list(self._members.values()), {}
        for member in members:
            member.target.close()

    # What the requests ask of the fleet.

    def _choose(self, busy: set[str]) -> _Member | None:
        """The member expected to answer first, not in `busy`, with room; its slot reserved."""
        now = time.monotonic()
        with self._lock:
            members = [
                member
                for name, member in self._members.items()
                if member.down_until <= now
                and name not in busy
                and member.outstanding < member.limit
            ]
            if not members:
                return None
            known = [
                member.latency
                for member in members
                if member.latency is not None and now - member.latency_at <= _STALE_AFTER
            ]
            typical = min(known, default=0.0)
            chosen = min(
                members,
                key=lambda member: (
                    (member.outstanding + 1) * member.expected_latency(now, typical),
                    member.outstanding,
                ),
            )
            chosen.outstanding += 1
            if chosen.quarantined is not None:
                # This request probes it: the others keep away until it answers.
                chosen.down_until = now + self._quarantine_backoff(chosen)
            return chosen

    def _load(self, member: _Member, request: wire.BatchRequest) -> _Attempt:
        """`member`'s attempt at `request` (its slot reserved by `_choose`), counted."""
        sent = time.monotonic()
        with self._lock:
            member.sent.append(sent)
        future = self._stats.track(member.target.name, lambda: _asked(member.target, request))
        future.add_done_callback(lambda done: self._settled(member, done, sent))
        return _Attempt(member, future, sent)

    def _settled(self, member: _Member, attempt: Future[Any], sent: float) -> None:
        now = time.monotonic()
        age = now - sent
        with self._lock:
            member.outstanding -= 1
            member.sent.remove(sent)
            if attempt.cancelled():
                # Given up unanswered (answered elsewhere first): it is at least this slow.
                member.latency = max(member.latency or 0.0, age)
                member.latency_at = now
            elif attempt.exception() is None:
                member.latency = (
                    age
                    if member.latency is None
                    else (1 - _EWMA_WEIGHT) * member.latency + _EWMA_WEIGHT * age
                )
                member.latency_at = self._answered_at = now
                member.limit = min(member.limit + 1, member.announced)
                self._latencies.add(age)

    def _failed(self, member: _Member, error: str) -> None:
        """A transient failure: `member` backs off briefly (a quarantine stays until it answers)."""
        with self._lock:
            member.failures += 1
            backoff = self.options.backoff_initial * 2 ** (member.failures - 1)
            member.down_until = time.monotonic() + min(backoff, self.options.backoff_max)
            member.last_error = error
        self._stats.failed(member.target.name, error)

    def _pressed(self, member: _Member, error: str) -> None:
        """`member` is full (RESOURCE_EXHAUSTED): it is sent fewer requests for a while."""
        with self._lock:
            member.limit = max(member.outstanding, 1)
            member.failures += 1
            backoff = self.options.backoff_initial * 2 ** (member.failures - 1)
            member.down_until = time.monotonic() + min(backoff, self.options.backoff_max)
            member.last_error = error

    def _hung(self, member: _Member, error: str) -> None:
        """An attempt of `member` was given up: after `HUNG_STRIKES` in a row, quarantined."""
        with self._lock:
            member.hangs += 1
            strikes = member.hangs
        if strikes >= HUNG_STRIKES:
            self._quarantine(member, f"{error} ({strikes} times in a row)")
        else:
            self._failed(member, error)

    def _quarantine(self, member: _Member, error: str) -> None:
        """`member` is wrong for this loader: kept off until a longer back-off, then tried again."""
        options = self.options
        with self._lock:
            member.quarantines += 1
            backoff = self._quarantine_backoff(member)
            member.down_until = time.monotonic() + backoff
            member.last_error = error
            entering, member.quarantined = member.quarantined is None, error
        name = member.target.name
        self._stats.failed(name, error)
        self._stats.quarantined(name, error)
        if entering:
            _log.warning(
                "quarantined %s: it is tried again after %g s, up to every %g s until it "
                "answers; its requests go to the other workers. It answered: %s",
                name,
                backoff,
                options.quarantine_max,
                error,
            )

    def _quarantine_backoff(self, member: _Member) -> float:
        options = self.options
        backoff = options.quarantine_initial * 2 ** max(member.quarantines - 1, 0)
        return float(min(backoff, options.quarantine_max))

    def _succeeded(self, member: _Member) -> None:
        with self._lock:
            released = member.quarantined is not None
            member.failures, member.hangs, member.quarantines, member.down_until = 0, 0, 0, 0.0
            member.quarantined = None
        if released:
            self._stats.quarantined(member.target.name, None)
            _log.info("%s answered again: out of quarantine", member.target.name)

    def _is_quarantined(self, member: _Member) -> bool:
        with self._lock:
            return member.quarantined is not None

    def _counted(self) -> None:
        """A first attempt went out: it earns a share of an extra attempt."""
        with self._lock:
            self._extra_credit = min(self._extra_credit + EXTRA_SHARE, _EXTRA_BURST)

    def _extra_available(self) -> bool:
        """Whether an extra attempt (a hedge, or a re-issue of a hung one) fits in the share."""
        with self._lock:
            return self._extra_credit >= 1.0

    def _spend_extra(self) -> None:
        with self._lock:
            self._extra_credit -= 1.0

    def _thresholds(self) -> tuple[float, float | None]:
        """(the age at which an attempt is hung, the age at which a request is hedged)."""
        options = self.options
        with self._lock:
            p95 = self._latencies.p95
        hung = options.request_timeout
        if p95 is not None:
            hung = min(hung, max(HUNG_FLOOR, HUNG_FACTOR * p95))
        hedge = options.hedge_after
        if hedge == "auto":
            return hung, None if p95 is None else HEDGE_FACTOR * p95
        return hung, hedge

    def _silent_since(self) -> float:
        with self._lock:
            return self._answered_at

    # The requests outstanding, checked every tick for hedges, hangs and give-ups.

    def _watch(self, request: _Request) -> None:
        with self._lock:
            self._requests.add(request)
            start, self._ticking = not self._ticking, True
        if start:
            self._scheduler.at(_TICK, self._tick)

    def _unwatch(self, request: _Request) -> None:
        with self._lock:
            self._requests.discard(request)

    def _tick(self) -> None:
        hung, hedge = self._thresholds()
        now = time.monotonic()
        with self._lock:
            requests = list(self._requests)
            self._ticking = bool(requests)
        # Requests go out in step order: the oldest ones outstanding block the in-order delivery
        # of the others (the oldest now, the next one as soon as it is answered), and are the
        # only ones worth hedging.
        front = heapq.nsmallest(HEDGED_FRONT, requests, key=lambda request: request.started)
        for request in requests:
            request.check(now, hung, hedge if request in front else None)
        if requests:
            self._scheduler.at(_TICK, self._tick)

    def _describe(self) -> str:
        with self._lock:
            return (
                "; ".join(
                    f"{name} (last error: {member.last_error}"
                    f"{'; quarantined' if member.quarantined is not None else ''})"
                    for name, member in self._members.items()
                )
                or "no targets"
            )


def _asked(target: Target, request: wire.BatchRequest) -> Future[Any]:
    """`target.load_batch(request)`; a target that raises instead (e.g. closed as it was
    chosen) gives a failed attempt, not a failed dispatcher."""
    try:
        return target.load_batch(request)
    except Exception as error:
        failed: Future[Any] = Future()
        failed.set_exception(
            WorkerError("UNAVAILABLE", f"{target.name} could not be asked: {error}")
        )
        return failed


def _new_member(target: Target, limit: int) -> _Member:
    announced = limit or DEFAULT_LIMIT
    return _Member(target, announced=announced, limit=announced)


@dataclasses.dataclass(eq=False)
class _Attempt:
    member: _Member
    future: Future[Any]
    sent: float
    given_up: bool = False  # judged hung: it may still answer, and wins if first


class _Request:
    """One batch request: its attempts on targets, and the future of its single answer."""

    def __init__(self, dispatcher: Dispatcher, request: wire.BatchRequest) -> None:
        self.future: Future[Any] = Future()
        self._dispatcher, self._request = dispatcher, request
        self._lock = threading.RLock()  # callbacks may run inside load_batch
        self._attempts: dict[str, _Attempt] = {}
        self.started = time.monotonic()
        self._failing_since: float | None = None  # when the first attempt failed
        self._poisoned: list[str] = []  # the workers that answered that the work is poison
        # By weak reference: a cycle through the future would keep its batch until a gc run.
        itself = weakref.ref(self)
        self.future.add_done_callback(lambda future: _call_if_alive(itself, future))
        dispatcher._counted()
        dispatcher._watch(self)
        self._dispatch()

    def check(self, now: float, hung: float, hedge: float | None) -> None:
        """Each tick: give up hung attempts, re-issue or hedge the request, or fail it."""
        with self._lock:
            if self.future.done() or self._gave_up(now):
                return
            for attempt in list(self._attempts.values()):
                if not attempt.given_up and now - attempt.sent >= hung:
                    attempt.given_up = True
                    self._note_failure()
                    age = now - attempt.sent
                    error = f"no answer within {hung:.3g} s (after {age:.3g} s)"
                    self._dispatcher._hung(attempt.member, error)
            live = [attempt for attempt in self._attempts.values() if not attempt.given_up]
            if not live:
                self._reissue(now)
            elif len(live) == 1 and hedge is not None and now - live[0].sent >= hedge:
                self._dispatch(extra=True)

    def _reissue(self, now: float) -> None:
        """Send the request again now that no attempt is live: freely after failures, when a
        hung attempt's worker is quarantined, or at `request_timeout`; else as an extra."""
        timeout = self._dispatcher.options.request_timeout
        free = any(
            self._dispatcher._is_quarantined(attempt.member) or now - attempt.sent >= timeout
            for attempt in self._attempts.values()
        )
        self._dispatch(extra=bool(self._attempts) and not free)

    def _dispatch(self, extra: bool = False) -> None:
        """Send an attempt to the best member free for it; an `extra` one only within the
        share of extra attempts."""
        with self._lock:
            if self.future.done() or self._gave_up(time.monotonic()):
                return
            if extra and not self._dispatcher._extra_available():
                return
            if self._poisoned and (
                len(self._poisoned) + len(self._attempts) > self._dispatcher.options.poison_retries
            ):
                return  # as many workers as may have it are trying it, or have failed it
            busy = set(self._attempts)
            # Another worker, if there is one, when one has failed it as poison.
            member = self._dispatcher._choose(busy | set(self._poisoned))
            if member is None and self._poisoned:
                member = self._dispatcher._choose(busy)
            if member is None:
                return  # the next tick tries again
            if extra:
                self._dispatcher._spend_extra()
            attempt = self._dispatcher._load(member, self._request)
            self._attempts[member.target.name] = attempt
        # Not the attempt itself: a cycle through its future would keep the batch until a gc run.
        attempt.future.add_done_callback(lambda done: self._on_answer(member, done))

    def _gave_up(self, now: float) -> bool:
        """Fail the request once the fleet has answered nothing, or every worker has been
        failing it, for `no_worker_timeout`."""
        limit = self._dispatcher.options.no_worker_timeout
        silent = now - max(self.started, self._dispatcher._silent_since())
        failing = 0.0 if self._failing_since is None else now - self._failing_since
        if max(silent, failing) < limit:
            return False
        self.future.set_exception(
            WorkerError(
                "UNAVAILABLE",
                f"no worker served step {self._request.step} within {limit:g} s; "
                f"targets: {self._dispatcher._describe()}",
            )
        )
        return True

    def _note_failure(self) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()

    def _on_answer(self, member: _Member, future: Future[Any]) -> None:
        with self._lock:
            attempt = self._attempts.get(member.target.name)
            if attempt is None or attempt.future is not future:
                return  # the request is done, and its attempts forgotten
            del self._attempts[member.target.name]
            if self.future.done():
                return  # answered elsewhere already: this answer is late
            error = (
                WorkerError("CANCELLED", "the attempt was cancelled")
                if future.cancelled()
                else future.exception()
            )
            if error is None:
                # Even an attempt given up as hung wins if it answers first.
                self._failing_since = None
                self._dispatcher._succeeded(member)
                self.future.set_result(future.result())
                return
            judged = verdict(error)
            if judged is Verdict.FATAL:
                self.future.set_exception(error)
                return
            self._note_failure()
            if isinstance(error, PoisonFailed):
                self._poisoned.append(member.target.name)
                if len(self._poisoned) > self._dispatcher.options.poison_retries:
                    self.future.set_exception(error.rebuild(self._poisoned))
                    return
                _log.warning("%s answered: %s", member.target.name, error.message)
            if judged is Verdict.QUARANTINE:
                self._dispatcher._quarantine(member, str(error))
            elif judged is Verdict.PRESSURE:
                self._dispatcher._pressed(member, str(error))
            elif not attempt.given_up:  # a given-up attempt was counted when given up
                self._dispatcher._failed(member, str(error))
            if all(other.given_up for other in self._attempts.values()):
                self._dispatch()  # at once: only this worker is kept off

    def _on_done(self, future: Future[Any]) -> None:
        self._dispatcher._unwatch(self)
        with self._lock:
            attempts, self._attempts = list(self._attempts.values()), {}
        for attempt in attempts:  # hedges and hung attempts still running: not needed now
            attempt.future.cancel()


def _call_if_alive(request: weakref.ref[_Request], future: Future[Any]) -> None:
    alive = request()
    if alive is not None:
        alive._on_done(future)
