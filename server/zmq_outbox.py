"""The ZeroMQ server's replies that libzmq holds: sent from their own buffers, and watched until
libzmq is done with them (written to the socket, or dropped), as pyzmq's trackers say; then the
ledger lets go of what they hold."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import zmq

from loadax.server.ledger import Held, Ledger


def tracked_frames(
    parts: Sequence[bytes | memoryview],
) -> tuple[list[zmq.Frame | bytes | memoryview], zmq.MessageTracker | None]:
    """`parts` as frames to send, and what tells when libzmq is done with them (sent, or
    dropped). Parts of `zmq.COPY_THRESHOLD` bytes or more (a batch's payload frames, views of
    its arrays) are sent from their own buffers and tracked (copying them costs more: 0.46
    against 0.26 s/GB at 1 MiB); smaller ones are copied, except the last, which is tracked
    too: libzmq lets go of a message's frames in order, so once it has let go of the last, it
    holds none of the others. A reply of small parts only (a header whose payload is in the
    client's memory file, an error) is copied whole and not tracked (None): libzmq then holds
    nothing of the worker's, and a tracker costs pyzmq's garbage collector thread a wake-up and
    the I/O thread its polls until it is done."""
    if all(len(part) < zmq.COPY_THRESHOLD for part in parts):
        return list(parts), None
    last = len(parts) - 1
    frames: list[zmq.Frame | bytes | memoryview] = [
        zmq.Frame(part, copy=False, track=True)
        if index == last or len(part) >= zmq.COPY_THRESHOLD
        else part
        for index, part in enumerate(parts)
    ]
    tracker = zmq.MessageTracker(*(frame for frame in frames if isinstance(frame, zmq.Frame)))
    return frames, tracker


@dataclasses.dataclass(frozen=True, slots=True)
class _Sent:
    """A reply handed to libzmq: its request's entry in the ledger (whose client is the routing
    identity), and what tells when libzmq is done with it."""

    held: Held
    tracker: zmq.MessageTracker


class Outbox:
    """The replies handed to libzmq that it has not finished with yet (sent, or dropped). The
    I/O thread `reap`s them: each is `ledger.done` once libzmq is."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._lock = threading.Lock()
        self._replies: list[_Sent] = []
        # Clients whose oldest reply was waited for in vain, not waited for again until one of
        # their replies is done: a client that does not read costs the I/O thread one wait.
        self._stalled: set[object] = set()

    @property
    def pending(self) -> int:
        return len(self._replies)

    def add(self, held: Held, tracker: zmq.MessageTracker) -> None:
        """Watch `tracker`, of the reply to `held`'s request, from before it is sent."""
        with self._lock:
            self._replies.append(_Sent(held, tracker))

    def reap(self) -> None:
        """Let go of the replies libzmq has finished with."""
        if not self._replies:
            return
        done: list[_Sent] = []
        pending: list[_Sent] = []
        with self._lock:
            for reply in self._replies:
                (done if reply.tracker.done else pending).append(reply)
            self._replies = pending
            self._stalled.difference_update(reply.held.client for reply in done)
        for reply in done:
            self._ledger.done(reply.held)

    def settle(self, client: object, timeout: float) -> None:
        """Give the oldest reply to `client` still out up to `timeout` to be done, then `reap`.
        libzmq lets go of a reply as soon as it is written, but pyzmq tells so from a thread of
        its own: a client that has read its reply may ask again before it has."""
        with self._lock:
            oldest = next((reply for reply in self._replies if reply.held.client == client), None)
            if client in self._stalled:
                oldest = None
        if oldest is not None:
            try:
                oldest.tracker.wait(timeout)
            except zmq.NotDone:
                with self._lock:
                    self._stalled.add(client)
        self.reap()

    def release_all(self) -> None:
        """Let go of every reply: libzmq has, or no client is served any more."""
        with self._lock:
            replies, self._replies = self._replies, []
            self._stalled.clear()
        for reply in replies:
            self._ledger.done(reply.held)
