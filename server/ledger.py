"""What a worker holds for its clients until their replies have left: one ledger for every
transport.

A request is held from its arrival until its transport has let its reply go: written to the
socket, or dropped (the client cancelled, went away, or the server stopped). Meanwhile it counts
against its client's in-flight limit and its connection's (once admitted) and its reply's bytes
count per client and in total; letting go also frees the reply's share of the worker's memory
budget. The transports only say when they have let a reply go (`Ledger.done`); what that
releases is decided here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable


@dataclasses.dataclass(eq=False, slots=True)
class Held:
    """One request's entry in a `Ledger`, changed only through it."""

    client: Hashable
    connection: Hashable
    """The connection it came over, which may carry several clients."""
    name: str
    """How the logs name the client."""
    waiting: int
    """The events still to come before it is let go of."""
    admitted: bool = False
    size: int = 0
    releases: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.waiting <= 0


@dataclasses.dataclass(slots=True)
class _Account:
    """One client's share of the ledger."""

    admitted: int = 0
    bytes: int = 0


class Ledger:
    """The requests of one transport's clients that are held, by client and in total.

    Handler threads and the transport's own threads open, admit and let go of entries at once;
    every change goes through this object and its lock.

    >>> ledger = Ledger()
    >>> held = ledger.open("client a", "client a", until=2)
    >>> ledger.admit(held, limit=1), ledger.admit(ledger.open("client a", "client a"), limit=1)
    (None, (1, 1))
    >>> ledger.admit(ledger.open("client b", "b", connection="client a"), 1, connection_limit=1)
    (0, 1)
    >>> ledger.hold(held, 100, lambda: print("released"))
    >>> ledger.of("client a"), ledger.held_bytes
    ((1, 100), 100)
    >>> ledger.done(held)  # the handler returned; the reply is still on its way
    >>> ledger.done(held)  # the transport has let it go
    released
    >>> ledger.of("client a"), ledger.in_flight, ledger.held_bytes
    ((0, 0), 0, 0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[Hashable, _Account] = {}
        self._connections: dict[Hashable, int] = {}  # admitted, per connection
        self._held = 0
        self._admitted = 0
        self._bytes = 0

    def open(
        self, client: Hashable, name: str, *, until: int = 1, connection: Hashable = None
    ) -> Held:
        """An entry for a request of `client` (`name` in logs) over `connection` (by default,
        the client is one), let go of once `done` has been called `until` times: once per event
        that must have happened first (e.g. the reply sent, and the handler returned)."""
        with self._lock:
            self._held += 1
        return Held(client, client if connection is None else connection, name, until)

    @property
    def held(self) -> int:
        """The entries not let go of yet, of every client."""
        return self._held

    @property
    def in_flight(self) -> int:
        """The admitted requests not let go of yet, of every client."""
        return self._admitted

    @property
    def held_bytes(self) -> int:
        """The bytes of the replies held, of every client."""
        return self._bytes

    def of(self, client: Hashable) -> tuple[int, int]:
        """`client`'s admitted requests and the bytes of its replies, held now."""
        with self._lock:
            account = self._accounts.get(client, _Account())
            return account.admitted, account.bytes

    def admit(
        self, held: Held, limit: int, connection_limit: int | None = None
    ) -> tuple[int, int] | None:
        """Count `held` among its client's requests in flight and its connection's, unless the
        client has `limit` already or the connection `connection_limit` (None: no limit of its
        own): None once counted, else the counts the client and the connection have."""
        with self._lock:
            if held.finished or held.admitted:
                return None
            account = self._accounts.setdefault(held.client, _Account())
            connection = self._connections.get(held.connection, 0)
            if account.admitted >= limit or (
                connection_limit is not None and connection >= connection_limit
            ):
                if not account.admitted and not account.bytes:
                    del self._accounts[held.client]
                return account.admitted, connection
            account.admitted += 1
            self._connections[held.connection] = connection + 1
            self._admitted += 1
            held.admitted = True
            return None

    def hold(self, held: Held, size: int, release: Callable[[], None]) -> None:
        """Count a reply of `size` bytes in `held`, and call `release` (what frees its share of
        the memory budget) when `held` is let go of; at once when it has been already."""
        with self._lock:
            if not held.finished:
                self._accounts.setdefault(held.client, _Account()).bytes += size
                self._bytes += size
                held.size += size
                held.releases.append(release)
                return
        release()

    def done(self, held: Held) -> None:
        """One of the events `held` waits for has happened; after the last, what it holds is
        let go of. Calls beyond the last do nothing."""
        with self._lock:
            if held.finished:
                return
            held.waiting -= 1
            if not held.finished:
                return
            self._held -= 1
            account = self._accounts.get(held.client)
            if account is not None:
                account.admitted -= held.admitted
                account.bytes -= held.size
                if not account.admitted and not account.bytes:
                    del self._accounts[held.client]
            if held.admitted:
                left = self._connections.pop(held.connection) - 1
                if left:
                    self._connections[held.connection] = left
            self._admitted -= held.admitted
            self._bytes -= held.size
            releases, held.releases = held.releases, []
        for release in releases:
            release()
