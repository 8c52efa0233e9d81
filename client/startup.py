"""Start-up of a `RemoteLoader`: every target connected and asked at once, the build proceeding as
soon as enough agree, the others joining as they come up.

Each listed target is asked the handshake on its own thread (a host name: each address it lists,
looked up again until it resolves or the start-up timeout passes). `build()` returns once every
target has answered, or once `min_workers` agree and the others have had `GRACE` seconds more;
it fails at the start-up timeout naming each target and what it said. A target not up by then
keeps being asked in the background until the loader closes, and joins when it answers.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Sequence

from loadax.client.identity import Answer, Choice, ask, choose
from loadax.client.targets import Target, TargetSpec
from loadax.errors import WorkerError
from loadax.wire.v1 import worker_pb2 as wire

GRACE = 1.0
"""Seconds the build waits for the other targets once `min_workers` agree."""
UNREACHABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
"""Handshake failures that say a target is not up yet: it is asked again."""
_RETRY_EVERY = 0.5  # seconds between lookups of a name that does not resolve, or handshakes

Resolver = Callable[[str], list[str]]
"""A host name -> the IP addresses it lists."""


def resolve_host(host: str) -> list[str]:
    """Every address DNS (or /etc/hosts) lists for `host`, sorted."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


@dataclasses.dataclass
class _Slot:
    """A listed target's place (its order breaks ties) and what it said so far."""

    order: tuple[int, int]
    name: str
    said: str = "no answer yet"
    answer: Answer | None = None
    settled: bool = False  # answered, or failed for good


class Gathering:
    """The targets of one loader being connected and asked, in the order they are listed.

    `connect(spec)` makes a target of an address or a worker object without waiting for it (a
    ValueError for a bad one, raised here); `expand(spec)` lists the addresses a spec with a
    host name stands for, None for any other spec, raising `OSError` while the name does not
    resolve (it is called on the background threads)."""

    def __init__(
        self,
        specs: Sequence[TargetSpec],
        request: wire.HandshakeRequest,
        *,
        connect: Callable[[TargetSpec], Target],
        expand: Callable[[TargetSpec], list[str] | None],
        is_name: Callable[[TargetSpec], bool],
        timeout: float,
    ) -> None:
        self._request, self._connect, self._expand = request, connect, expand
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._condition = threading.Condition()
        self._slots: list[_Slot] = []
        self._targets: list[Target] = []  # every target connected, answered or not
        self._closed = False
        self._joined: Callable[[Answer], None] | None = None
        started: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        try:
            for index, spec in enumerate(specs):
                if is_name(spec):
                    assert isinstance(spec, str)
                    started.append((self._look_up, (self._slot((index, 0), spec), spec)))
                else:
                    target = connect(spec)
                    self._targets.append(target)
                    started.append((self._ask, (self._slot((index, 0), target.name), target)))
        except BaseException:
            self.close(every=True)
            raise
        for run, args in started:
            threading.Thread(target=run, args=args, name="loadax-startup", daemon=True).start()

    def choose(self, pipeline: str, min_workers: int, joined: Callable[[Answer], None]) -> Choice:
        """The identity the most targets answered once enough agree (see the module); answers
        that come later go to `joined`. Raises naming each target when too few agree in time;
        then every target is closed."""
        agreed_at: float | None = None
        with self._condition:
            while True:
                now = time.monotonic()
                answers = self._answers()
                agreeing = _agreeing(answers)
                if agreeing >= min_workers and agreed_at is None:
                    agreed_at = now
                settled = all(slot.settled for slot in self._slots)
                if settled or now >= self._deadline:
                    break
                if agreed_at is not None and now >= agreed_at + GRACE:
                    break
                wake = self._deadline if agreed_at is None else agreed_at + GRACE
                self._condition.wait(min(wake, self._deadline) - now)
            if agreeing >= min_workers:
                self._joined = joined
                return choose(answers, pipeline)
        self.close(every=True)
        if settled and not agreeing and answers:
            choose(answers, pipeline)  # raises what no target serving the pipeline calls for
        raise self._failure(pipeline, min_workers, agreeing)

    def close(self, every: bool = False) -> None:
        """Stop asking; close the targets that have not answered (`every`: all of them)."""
        with self._condition:
            self._closed = True
            answered = {id(slot.answer.target) for slot in self._slots if slot.answer is not None}
            targets = [target for target in self._targets if every or id(target) not in answered]
            self._condition.notify_all()
        for target in targets:
            target.close()

    # The background threads.

    def _slot(self, order: tuple[int, int], name: str) -> _Slot:
        with self._condition:
            slot = _Slot(order, name)
            self._slots.append(slot)
            self._slots.sort(key=lambda each: each.order)
            return slot

    def _look_up(self, slot: _Slot, spec: str) -> None:
        """Ask each address `spec`'s host name lists, once it resolves (until the deadline)."""
        while True:
            try:
                addresses = self._expand(spec) or []
                break
            except OSError as error:
                self._note(slot, f"the name does not resolve: {error}")
                if time.monotonic() >= self._deadline or not self._sleep(_RETRY_EVERY):
                    return  # a loader's refresh looks it up again later
        asked: list[tuple[_Slot, Target]] = []
        for position, address in enumerate(addresses):
            try:
                target = self._connect(address)
            except ValueError as error:
                self._note(slot, f"{address}: {error}", settled=True)
                return
            with self._condition:
                if self._closed:
                    target.close()
                    return
                self._targets.append(target)
            asked.append((self._slot((slot.order[0], position), target.name), target))
        with self._condition:
            self._slots.remove(slot)
            self._condition.notify_all()
        for each, target in asked:
            threading.Thread(
                target=self._ask, args=(each, target), name="loadax-startup", daemon=True
            ).start()

    def _ask(self, slot: _Slot, target: Target) -> None:
        """Ask `target` until it answers or refuses, or the gathering closes."""
        while True:
            started = time.monotonic()
            try:
                answer = ask(target, self._request, max(self._deadline - started, _RETRY_EVERY))
            except WorkerError as error:
                if error.code in UNREACHABLE:
                    self._note(slot, str(error))
                    if self._sleep(max(_RETRY_EVERY - (time.monotonic() - started), 0.0)):
                        continue
                    return
                answer = Answer(target, None, error)
            with self._condition:
                slot.answer, slot.settled, slot.said = answer, True, str(answer)
                joined = None if self._closed else self._joined
                self._condition.notify_all()
            if joined is not None:
                joined(answer)
            return

    def _note(self, slot: _Slot, said: str, settled: bool = False) -> None:
        with self._condition:
            slot.said, slot.settled = said, settled
            self._condition.notify_all()

    def _sleep(self, seconds: float) -> bool:
        """Sleep `seconds` unless closed first; whether still open."""
        with self._condition:
            self._condition.wait_for(lambda: self._closed, seconds)
            return not self._closed

    # What the build sees.

    def _answers(self) -> list[Answer]:
        return [slot.answer for slot in self._slots if slot.answer is not None]

    def _failure(self, pipeline: str, min_workers: int, agreeing: int) -> WorkerError:
        with self._condition:
            said = "; ".join(f"{slot.name}: {slot.said}" for slot in self._slots)
            count = len(self._slots)
        return WorkerError(
            "UNAVAILABLE",
            f"{agreeing} of {count} targets agreed to serve pipeline {pipeline!r} within "
            f"{self._timeout:g} s; {min_workers} needed (min_workers). {said}",
        )


def _agreeing(answers: Sequence[Answer]) -> int:
    """How many answers serve the identity that the most of them serve."""
    counts: dict[object, int] = {}
    for answer in answers:
        if answer.identity is not None:
            counts[answer.identity] = counts.get(answer.identity, 0) + 1
    return max(counts.values(), default=0)
