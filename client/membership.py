"""Who is in one loader's fleet: the listed targets and the addresses their host names list (looked
up again over time), what each answered the handshake, the members joined to the driver, and
those left out for what they answered.

At start-up every target is asked on a thread of its own (a host name: each address it lists,
looked up until it resolves or the start-up timeout passes); of more addresses than `subset`
(the literal ones, or those of one name), only the client's arc of them (`loadax.client.subset`)
is asked, and the others are listed to the driver, whose policy connects them as its aperture
reaches them (`connect_member`). `bind()` returns once every target has answered, or once
`min_workers` agree and the others have had `GRACE` seconds more (`loadax.client.startup`); it
fails at the start-up timeout naming each target and what it said, or sooner, once every
target's failure has been final (refused, a name that does not exist, another protocol) for
`give_up_after` seconds. A target not up by then keeps being asked in the background until the
loader closes, and joins when it answers right.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from loadax.client.driver import Driver
from loadax.client.identity import choose, require
from loadax.client.member import LEAVES_OUT, Identity, Member, ask
from loadax.client.names import (
    NamedAddresses,
    Resolver,
    every,
    host_is_name,
    listed_addresses,
)
from loadax.client.startup import Listed, StartupWait, bound_choice, startup_failure
from loadax.client.subset import Seat, aperture
from loadax.client.transports import TargetSpec, Transport
from loadax.client.transports.diagnosis import Diagnosis
from loadax.errors import WorkerError
from loadax.logfields import fields
from loadax.wire.limits import DEFAULT_TIMEOUT_S
from loadax.wire.v1 import worker_pb2 as wire

_log = logging.getLogger("loadax.client")

UNREACHABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
"""Handshake failures that say a target is not up yet: it is asked again."""
_RETRY_EVERY = 0.5  # seconds between lookups of a name that does not resolve, or handshakes
_ATTEMPT_S = 2.0  # the most one handshake waits, so that an unanswered one is diagnosed
DIAGNOSIS_S = 0.5
"""The most a diagnosis of a target that did not answer may take (seconds)."""

Diagnose = Callable[[str], Diagnosis | None]
"""An address -> why it does not answer (None: its port speaks what the client does)."""


class Membership:
    """The fleet of one loader (see the module). `handshake(records)` is the handshake request
    for a dataset of `records` records (1 before the build knows); `connect(spec)` makes a
    transport of an address or a worker object without waiting for it (a ValueError for a bad
    one, raised here)."""

    def __init__(
        self,
        specs: Sequence[TargetSpec],
        pipeline: str,
        handshake: Callable[[int], wire.HandshakeRequest],
        *,
        connect: Callable[[TargetSpec], Transport],
        resolver: Resolver,
        timeout: float,
        give_up_after: float | None = None,
        diagnose: Diagnose = lambda address: None,
        seat: Seat | None = None,
        subset: int = 64,
    ) -> None:
        self._seat, self._subset = seat or Seat(), subset
        self._give_up_after = give_up_after
        self._pipeline, self._handshake, self._connect = pipeline, handshake, connect
        self._diagnose = diagnose
        self._request = handshake(1)
        self._resolver, self._timeout = resolver, timeout
        self._deadline = time.monotonic() + timeout
        self._names = [spec for spec in specs if host_is_name(spec)]
        # Guards everything below, which the start-up threads and the refreshes change.
        self._condition = threading.Condition()
        self._listed: list[Listed] = []
        self._transports: list[Transport] = []  # every one connected, answered or not
        self._closed = False
        self._driver: Driver | None = None  # set once bound: later answers join it
        self._identity: Identity | None = None
        self._named = NamedAddresses()
        self._left_out: dict[str, str] = {}
        literal = [spec for spec in specs if isinstance(spec, str) and not host_is_name(spec)]
        self._standby = self._beyond_arc(literal)  # not asked at start-up, listed once bound
        started: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        try:
            for index, spec in enumerate(specs):
                if host_is_name(spec):
                    started.append((self._look_up, (self._list((index, 0), spec), spec)))
                elif spec not in self._standby:
                    transport = connect(spec)
                    self._transports.append(transport)
                    listed = self._list((index, 0), transport.name)
                    started.append((self._ask, (listed, transport)))
        except BaseException:
            self.close(every=True)
            raise
        for run, args in started:
            threading.Thread(target=run, args=args, name="loadax-startup", daemon=True).start()

    @property
    def left_out(self) -> dict[str, str]:
        """The targets not used, and what they answered that left them out."""
        with self._condition:
            return dict(self._left_out)

    def bind(
        self,
        min_workers: int,
        driver: Driver,
        pinned: str | None = None,
        fallback: Identity | None = None,
    ) -> Identity:
        """The identity the most members answered (or the `pinned` fingerprint) once enough
        agree (see the module); its members join `driver`, and so do later ones that serve it.
        Raises naming each target when too few agree in time, or when identities tie; then
        every transport is closed. With a `fallback` (the local members' identity), too few
        agreeing binds to it instead, unless a member serves another identity or another is
        pinned: the targets keep being asked and join when they answer it."""
        wait = StartupWait(min_workers, pinned, self._deadline, self._give_up_after)
        with self._condition:
            while (seconds := wait.look(self._listed, time.monotonic())) is not None:
                self._condition.wait(seconds)
            members, agreed = wait.members, wait.agreed
            choice, split = None, None
            try:
                choice = bound_choice(
                    members, agreed, min_workers, self._pipeline, pinned, fallback
                )
            except ValueError as error:  # identities tie, or none is the pinned one
                split = error
            if choice is not None:
                self._driver, self._identity = driver, choice.identity
                self._request = self._handshake(choice.identity.num_records)
                self._named.bound({member.name for member in choice.chosen} | set(self._standby))
                for member in choice.left_out:
                    self._leave_out(member.name, choice.why_left_out(member))
        if choice is None:
            # What each target said, before closing cancels the attempts still in flight.
            with self._condition:
                said = [(listed.name, listed.said) for listed in self._listed]
            self.close(every=True)
            if split is not None:
                raise split
            if wait.settled and not agreed and members:
                choose(members, self._pipeline, pinned)  # raises why no member serves
            gave_up = self._give_up_after if wait.hopeless <= time.monotonic() else None
            raise startup_failure(said, self._pipeline, min_workers, agreed, gave_up, self._timeout)
        for member in choice.left_out:
            member.transport.close()
        joined: set[str] = set()
        for member in choice.chosen:
            if member.name in joined:  # worker objects of one class share their name
                member.transport.close()
                continue
            joined.add(member.name)
            driver.join(member)
        with self._condition:
            standby, self._standby = self._standby, []
        for name in standby:
            driver.enlist(name)
        return choice.identity

    def connect_member(self, name: str) -> Member:
        """Listed member `name` connected, if it serves the loader's identity (else a
        ValueError, and it is named among those left out); the driver's `connect`."""
        assert self._identity is not None
        transport = self._connect(name)
        try:
            member = ask(transport, self._request, _ATTEMPT_S)
            require(member, self._identity, self._pipeline)
        except ValueError as error:
            transport.close()
            with self._condition:
                self._leave_out(name, str(error))
            raise
        except BaseException:
            transport.close()
            raise
        with self._condition:
            self._left_out.pop(name, None)
        return member

    def add(self, spec: TargetSpec) -> None:
        """Use another worker, after checking it serves the loader's identity: a ValueError
        naming both identities if not, the worker's error if it cannot serve."""
        transport = self._connect(spec)
        try:
            member = ask(transport, self._request, DEFAULT_TIMEOUT_S)
            self._join(member)
        except BaseException:
            transport.close()
            raise

    def remove(self, name: str, members: list[str]) -> None:
        """Stop using member `name` (one of `members`)."""
        if name not in members:
            raise ValueError(f"{name} is not a target; targets are {members}")
        assert self._driver is not None
        self._driver.leave(name)

    def refresh(self, members: list[str]) -> None:
        """Look the target names up again; add the addresses that appeared, drop those gone
        (`members`: the members in use)."""
        listed = {address for name in self._names for address in self._resolve(name)}
        with self._condition:
            gone, forgotten, new = self._named.relisted(listed)
            for name in forgotten:
                self._left_out.pop(name, None)
        for name in sorted(gone & set(members)):
            self.remove(name, members)
        for name in new:
            if name not in members:
                try:
                    self.add(name)
                except (ValueError, WorkerError) as error:
                    if isinstance(error, WorkerError) and error.code not in LEAVES_OUT:
                        raise
                    with self._condition:
                        self._named.refused(name)
                        self._leave_out(name, str(error))
                    continue
            with self._condition:
                self._named.joined(name)

    def refresh_every(self, seconds: float, members: Callable[[], list[str]]) -> None:
        """Refresh on a thread of its own every `seconds` until closed (when names are listed)."""
        if self._names:
            every(seconds, lambda: self.refresh(members()), self._sleep, self._names)

    def close(self, every: bool = False) -> None:
        """Stop asking; close the transports that have not answered (`every`: all of them)."""
        with self._condition:
            self._closed = True
            answered = {id(listed.member.transport) for listed in self._listed if listed.member}
            transports = [
                transport
                for transport in self._transports
                if every or id(transport) not in answered
            ]
            self._condition.notify_all()
        for transport in transports:
            transport.close()

    # Members that answer after the build.

    def _join(self, member: Member) -> None:
        assert self._driver is not None
        assert self._identity is not None
        require(member, self._identity, self._pipeline)
        self._driver.join(member)
        with self._condition:
            self._left_out.pop(member.name, None)

    def _arrived(self, member: Member) -> None:
        """A member that answered after the build: used if it serves the loader's identity."""
        name = member.name
        try:
            self._join(member)
        except (ValueError, WorkerError) as error:
            member.transport.close()
            with self._condition:
                self._named.refused(name)
                self._leave_out(name, str(error))
            return
        with self._condition:
            self._named.joined(name)
        _log.info(
            "%s answered after the build and joined",
            name,
            extra=fields(event="joined", target=name),
        )

    def _leave_out(self, name: str, why: str) -> None:
        _log.warning(
            "left out %s, which cannot serve this loader: %s",
            name,
            why,
            extra=fields(event="left_out", target=name, error=why),
        )
        self._left_out[name] = why

    # The start-up threads.

    def _list(self, order: tuple[int, int], name: str) -> Listed:
        with self._condition:
            listed = Listed(order, name)
            self._listed.append(listed)
            self._listed.sort(key=lambda each: each.order)
            return listed

    def _look_up(self, listed: Listed, spec: str) -> None:
        """Ask each address `spec`'s host name lists, once it resolves (until the deadline)."""
        while True:
            try:
                addresses = self._resolve(spec)
                break
            except OSError as error:
                self._note(listed, f"the name does not resolve: {error}", final=True)
                if time.monotonic() >= self._deadline or self._sleep(_RETRY_EVERY):
                    return  # a refresh looks it up again later
        beyond = self._beyond_arc(addresses)
        with self._condition:
            driver = self._driver
            if driver is None:
                self._standby += beyond
        if driver is not None:
            for address in beyond:
                driver.enlist(address)
        asked: list[tuple[Listed, Transport]] = []
        for position, address in enumerate(addresses):
            if address in beyond:
                continue
            try:
                transport = self._connect(address)
            except ValueError as error:
                self._note(listed, f"{address}: {error}", settled=True)
                return
            with self._condition:
                if self._closed:
                    transport.close()
                    return
                self._transports.append(transport)
            asked.append((self._list((listed.order[0], position), transport.name), transport))
        with self._condition:
            self._listed.remove(listed)
            self._condition.notify_all()
        for each, transport in asked:
            threading.Thread(
                target=self._ask, args=(each, transport), name="loadax-startup", daemon=True
            ).start()

    def _ask(self, listed: Listed, transport: Transport) -> None:
        """Ask `transport`'s worker until it answers or refuses, or the membership closes."""
        while True:
            started = time.monotonic()
            try:
                timeout = min(max(self._deadline - started, _RETRY_EVERY), _ATTEMPT_S)
                member = ask(transport, self._request, timeout)
            except WorkerError as error:
                if error.code in UNREACHABLE:
                    why = self._diagnose(transport.name)
                    if why is None:
                        self._note(listed, str(error))
                    else:
                        self._note(listed, f"{why} ({error})", final=why.final)
                    if self._sleep(max(_RETRY_EVERY - (time.monotonic() - started), 0.0)):
                        return
                    continue
                member = Member.refused(transport, error)
            with self._condition:
                listed.member, listed.settled, listed.said = member, True, str(member)
                bound = not self._closed and self._driver is not None
                self._condition.notify_all()
            if bound:
                self._arrived(member)
            return

    def _beyond_arc(self, addresses: Sequence[str]) -> list[str]:
        """Of `addresses`, those beyond the client's arc of `subset` of them: not asked."""
        ring = sorted(set(addresses))
        arc = aperture(ring, self._seat, self._subset, lambda address: True, self._subset)
        return [address for address in ring if address not in arc]

    def _note(self, listed: Listed, said: str, settled: bool = False, final: bool = False) -> None:
        with self._condition:
            listed.said, listed.settled = said, settled
            if not final:
                listed.final_since = None
            elif listed.final_since is None:
                listed.final_since = time.monotonic()
            self._condition.notify_all()

    def _sleep(self, seconds: float) -> bool:
        """Sleep `seconds` unless closed first; whether closed."""
        with self._condition:
            return self._condition.wait_for(lambda: self._closed, seconds)

    def _resolve(self, spec: str) -> list[str]:
        """The addresses a spec with a host name stands for: one per address it lists."""
        addresses = listed_addresses(spec, self._resolver)
        with self._condition:
            self._named.listed.update(addresses)
        return addresses
