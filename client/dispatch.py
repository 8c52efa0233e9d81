"""Failover for batch requests: deadlines, re-issue, hedging, quarantine, and targets that come
and go.

Any worker can serve any request, so a request that fails, times out or lands on a worker that
dies is simply sent to another one; the batch is the same wherever it is made. A late answer to
a request already answered elsewhere is dropped. Failed targets back off and are tried again, so
a worker restarted on the same address is used again. A worker that is wrong for this loader
(another pipeline identity, no such pipeline, a reply that fails its checks) is quarantined: kept
off for longer, then tried again with a real request, so a worker restarted right rejoins.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loadax.client.stats import StatsRecorder
from loadax.client.targets import Target
from loadax.client.verdicts import Verdict, verdict
from loadax.errors import WorkerError
from loadax.validation import require_positive
from loadax.wire.v1 import worker_pb2 as wire

_log = logging.getLogger("loadax.client")


@dataclasses.dataclass(frozen=True, slots=True)
class FailoverOptions:
    """How long to wait, when to hedge, when to give up on every worker, and how long a failed
    (`backoff_*`) or quarantined (`quarantine_*`) worker is kept off, doubling from the initial
    value up to the maximum (seconds)."""

    request_timeout: float = 60.0
    hedge_after: float | None = None
    no_worker_timeout: float = 120.0
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    quarantine_initial: float = 1.0
    quarantine_max: float = 4.0

    def __post_init__(self) -> None:
        for name in (
            "request_timeout",
            "no_worker_timeout",
            "backoff_initial",
            "backoff_max",
            "quarantine_initial",
            "quarantine_max",
        ):
            require_positive(name, getattr(self, name), unit="seconds")
        if self.hedge_after is not None:
            require_positive("hedge_after", self.hedge_after, unit="seconds")


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
            if callback is not None:
                callback()


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
    down_until: float = 0.0
    failures: int = 0  # in a row, since its last answer
    quarantines: int = 0  # in a row, since its last answer
    quarantined: str | None = None  # why, until it answers again
    last_error: str = "none"


class Dispatcher:
    """Sends each batch request to a healthy target and sees it through to one answer;
    counts each target's requests, failures and latency in `stats`."""

    def __init__(
        self, targets: list[Target], options: FailoverOptions, stats: StatsRecorder
    ) -> None:
        self.options = options
        self._stats = stats
        self._lock = threading.Lock()
        self._members = {target.name: _Member(target) for target in targets}
        self._scheduler = Scheduler()

    @property
    def targets(self) -> list[str]:
        with self._lock:
            return list(self._members)

    def add(self, target: Target) -> None:
        with self._lock:
            if target.name in self._members:
                raise ValueError(f"{target.name} is a target already")
            self._members[target.name] = _Member(target)

    def remove(self, name: str) -> None:
        """Stop using a target; what it still held is re-issued to the others."""
        with self._lock:
            member = self._members.pop(name, None)
        if member is None:
            raise ValueError(f"{name} is not a target; targets are {self.targets}")
        self._stats.forget(name)
        member.target.close()

    def send(self, request: wire.BatchRequest) -> Future[Any]:
        return _Request(self, request).future

    def close(self) -> None:
        self._scheduler.stop()
        with self._lock:
            members, self._members = list(self._members.values()), {}
        for member in members:
            member.target.close()

    def _choose(self, step: int, busy: set[str]) -> _Member | None:
        now = time.monotonic()
        with self._lock:
            ready = [
                member
                for name, member in self._members.items()
                if member.down_until <= now and name not in busy
            ]
            if not ready:
                return None
            member = ready[step % len(ready)]
            if member.quarantined is not None:
                # This request probes it: the others keep away until it answers.
                member.down_until = now + self._quarantine_backoff(member)
            return member

    def _next_ready_in(self) -> float:
        now = time.monotonic()
        with self._lock:
            waits = [member.down_until - now for member in self._members.values()]
        return max(min(waits, default=self.options.backoff_max), 0.0)

    def _load(self, member: _Member, request: wire.BatchRequest) -> Future[Any]:
        """`member`'s attempt at `request`, counted in the stats."""
        return self._stats.track(member.target.name, lambda: member.target.load_batch(request))

    def _failed(self, member: _Member, error: str) -> None:
        """A transient failure: `member` backs off briefly (a quarantine stays until it answers)."""
        with self._lock:
            member.failures += 1
            backoff = self.options.backoff_initial * 2 ** (member.failures - 1)
            member.down_until = time.monotonic() + min(backoff, self.options.backoff_max)
            member.last_error = error
        self._stats.failed(member.target.name, error)

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
            member.failures, member.quarantines, member.down_until = 0, 0, 0.0
            member.quarantined = None
        if released:
            self._stats.quarantined(member.target.name, None)
            _log.info("%s answered again: out of quarantine", member.target.name)

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


class _Request:
    """One batch request: its attempts on targets, and the future of its single answer."""

    def __init__(self, dispatcher: Dispatcher, request: wire.BatchRequest) -> None:
        self.future: Future[Any] = Future()
        self._dispatcher, self._request = dispatcher, request
        self._lock = threading.RLock()  # callbacks may run inside load_batch
        self._attempts: dict[str, Future[Any]] = {}
        # Deadlines and hedges hold this request (and so its batch) until cancelled.
        self._timers: list[Timer] = []
        self._failing_since: float | None = None  # when the first attempt failed
        # By weak reference: a cycle through the future would keep its batch until a gc run.
        itself = weakref.ref(self)
        self.future.add_done_callback(lambda future: _call_if_alive(itself, future))
        self._dispatch()

    def _dispatch(self) -> None:
        with self._lock:
            if self.future.done() or self._gave_up():
                return
            member = self._dispatcher._choose(self._request.step, set(self._attempts))
            if member is None:
                if not self._attempts:
                    self._retry_later()
                return
            attempt = self._dispatcher._load(member, self._request)
            self._attempts[member.target.name] = attempt
        options = self._dispatcher.options
        scheduler = self._dispatcher._scheduler
        self._keep(
            scheduler.at(options.request_timeout, lambda: self._on_deadline(member, attempt))
        )
        if options.hedge_after is not None:
            self._keep(scheduler.at(options.hedge_after, lambda: self._on_hedge(attempt)))
        attempt.add_done_callback(lambda done: self._on_answer(member, done))

    def _gave_up(self) -> bool:
        """Fail the request once every worker has been failing it for `no_worker_timeout`."""
        limit = self._dispatcher.options.no_worker_timeout
        if self._failing_since is None or time.monotonic() - self._failing_since < limit:
            return False
        self.future.set_exception(
            WorkerError(
                "UNAVAILABLE",
                f"no worker served step {self._request.step} within {limit:g} s; "
                f"targets: {self._dispatcher._describe()}",
            )
        )
        return True

    def _retry_later(self) -> None:
        """Every target is backing off: try again when the first one is ready (or give up)."""
        failing_since = self._failing_since or time.monotonic()
        until_limit = failing_since + self._dispatcher.options.no_worker_timeout - time.monotonic()
        delay = min(self._dispatcher._next_ready_in(), until_limit)
        self._dispatcher._scheduler.at(max(delay, 0.001), self._dispatch)

    def _failed(self, member: _Member, error: str, verdict: Verdict = Verdict.RETRY) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        if verdict is Verdict.QUARANTINE:
            self._dispatcher._quarantine(member, error)
        else:
            self._dispatcher._failed(member, error)

    def _on_answer(self, member: _Member, attempt: Future[Any]) -> None:
        with self._lock:
            current = self._attempts.get(member.target.name) is attempt
            if current:
                del self._attempts[member.target.name]
            if self.future.done():
                return  # answered elsewhere already: this answer is late
            error = (
                WorkerError("CANCELLED", "the attempt was cancelled")
                if attempt.cancelled()
                else attempt.exception()
            )
            if error is None:
                # Even an attempt given up at its deadline wins if it answers first.
                self._failing_since = None
                self._dispatcher._succeeded(member)
                self.future.set_result(attempt.result())
            elif not current:
                return  # given up at its deadline, and counted as a failure then
            elif (judged := verdict(error)) is Verdict.FATAL:
                self.future.set_exception(error)
            else:
                self._failed(member, str(error), judged)
                if not self._attempts:
                    self._dispatch()  # at once: only this worker is kept off

    def _on_deadline(self, member: _Member, attempt: Future[Any]) -> None:
        with self._lock:
            if attempt.done() or self.future.done():
                return
            if self._attempts.get(member.target.name) is attempt:
                del self._attempts[member.target.name]
            timeout = self._dispatcher.options.request_timeout
            self._failed(member, f"no answer within {timeout:g} s")
            attempt.cancel()  # best effort: a hung worker may still answer, and is ignored
            if not self._attempts:
                self._dispatch()

    def _on_hedge(self, attempt: Future[Any]) -> None:
        with self._lock:
            if not attempt.done() and len(self._attempts) == 1:
                self._dispatch_extra()

    def _dispatch_extra(self) -> None:
        member = self._dispatcher._choose(self._request.step, set(self._attempts))
        if member is None:
            return
        extra = self._dispatcher._load(member, self._request)
        self._attempts[member.target.name] = extra
        timeout = self._dispatcher.options.request_timeout
        self._keep(
            self._dispatcher._scheduler.at(timeout, lambda: self._on_deadline(member, extra))
        )
        extra.add_done_callback(lambda done: self._on_answer(member, done))

    def _keep(self, timer: Timer) -> None:
        """Hold `timer` until the request is done (at once cancelled if it is already)."""
        with self._lock:
            if self.future.done():
                timer.cancel()
            else:
                self._timers.append(timer)

    def _on_done(self, future: Future[Any]) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
            attempts = list(self._attempts.values()) if future.cancelled() else []
        for timer in timers:
            timer.cancel()
        for attempt in attempts:
            attempt.cancel()


def _call_if_alive(request: weakref.ref[_Request], future: Future[Any]) -> None:
    alive = request()
    if alive is not None:
        alive._on_done(future)
