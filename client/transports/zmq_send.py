"""Sending a ZeroMQ client's requests on its DEALER socket, on the I/O thread: each at once while a
connection takes it, else held, in order, for the next connection or failed at once to be sent to
another worker; and telling the worker of cancels."""

from __future__ import annotations

import collections
import logging
import queue
import socket
from collections.abc import Callable
from typing import Any

import zmq

from loadax.client.transports.zmq_connection import Connection
from loadax.client.transports.zmq_pending import Cancel, Pending
from loadax.wire import zmq_frames

log = logging.getLogger(__name__)

Outbox = queue.SimpleQueue[tuple[int, list[bytes]] | Cancel | socket.socket | None]
"""What callers hand the I/O thread: requests to send (id, frames), cancels, data sockets to read,
and None: close."""


class RequestSender:
    """Sends the requests to the worker `name` on `socket` (on the thread that owns it), with
    `token`. `waiting(id)` is the request of that id still waiting for its reply (None: cancelled,
    or failed already), and `fail(id, why)` fails it with UNAVAILABLE."""

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        name: str,
        token: str | None,
        connection: Connection,
        waiting: Callable[[int], Pending[Any] | None],
        fail: Callable[[int, str], None],
    ) -> None:
        self._socket, self._name, self._token = socket, name, token
        self._connection = connection
        self._waiting, self._fail = waiting, fail
        # The requests sent and neither answered nor cancelled yet; those that found no
        # connection, held for one in order.
        self._sent: set[int] = set()
        self._held: collections.deque[tuple[int, list[bytes]]] = collections.deque()

    def take(self, outbox: Outbox, adopt: Callable[[socket.socket], None]) -> bool:
        """Send the requests and cancels of `outbox`, and `adopt` its data sockets, until it is
        empty (True) or says to close (False)."""
        # Every submission is queued before its wake-up is sent, so none is missed here; this
        # thread alone takes from it, so an outbox not empty holds an item for it.
        while not outbox.empty():
            item = outbox.get_nowait()
            if item is None:
                return False
            if isinstance(item, Cancel):
                self.cancel(item.request_id, item.anyway)
            elif isinstance(item, socket.socket):
                adopt(item)
            else:
                self.send(*item)
        return True

    def send(self, request_id: int, frames: list[bytes]) -> None:
        """Send the request `request_id` now, or hold or fail it when no connection takes it."""
        if self._held:  # no connection yet: behind those waiting for one, or failed
            self._unsent(request_id, frames)
            return
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            # With IMMEDIATE a DEALER refuses to queue when it has no connection (none yet,
            # one just dropped, or a peer frozen mid-handshake).
            self._unsent(request_id, frames)
        else:
            self._sent.add(request_id)

    def cancel(self, request_id: int, anyway: bool = False) -> None:
        """Tell the worker that the request `request_id` is no longer waited for, if it was sent
        (here, or `anyway`) and not answered (one never sent is dropped from those held, as it
        comes). Best effort: without room to send it, the worker answers the request, a reply
        dropped here."""
        if request_id not in self._sent and not anyway:
            return
        self._sent.discard(request_id)
        try:
            self._socket.send_multipart(
                zmq_frames.cancel_frames(request_id, self._token), zmq.NOBLOCK
            )
        except zmq.Again:
            log.debug("could not tell %s of the cancel of request %d", self._name, request_id)

    def send_held(self) -> None:
        """Send the requests waiting for a connection, in order, while one takes them."""
        while self._held:
            request_id, frames = self._held[0]
            if self._waiting(request_id) is not None:
                try:
                    self._socket.send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    return
                self._sent.add(request_id)
            self._held.popleft()

    def answered(self, request_id: int) -> None:
        """The request `request_id` has its reply."""
        self._sent.discard(request_id)

    def lost(self) -> set[int]:
        """The connection is down: the requests it carried, no longer sent. Those held still
        wait for the next one."""
        lost, self._sent = self._sent, set()
        return lost

    def refused(self) -> None:
        """The worker refused the connection for good: nothing held will ever be sent."""
        self._held.clear()
        self._sent.clear()

    def _unsent(self, request_id: int, frames: list[bytes]) -> None:
        """A request that found no connection: held until there is one if it is patient (and
        before the first connection, which a refused security handshake never makes, so that
        its event says why), else failed with UNAVAILABLE, to be sent to another worker."""
        entry = self._waiting(request_id)
        if entry is None:
            return  # cancelled, or failed already
        if entry.patient or not self._connection.connected_once:
            self._held.append((request_id, frames))
            return
        self._fail(request_id, f"{self._name} is not reachable: no connection")
