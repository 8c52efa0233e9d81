"""The ZeroMQ I/O of a client process: one context (a fixed number of I/O threads) and one thread
that serves every `ZmqTransport`'s sockets, however many workers it reaches.

The thread waits on the sockets' file descriptors (`zmq.FD`) and on a wake-up pipe that callers
write to when they hand a target work. A socket's descriptor only says that something may have
changed: a target reads `zmq.EVENTS` last when served, and asks to be served again at once while
it has more to read. A target whose serving raises is logged and let go (its sockets unwatched):
the thread goes on serving the process's other transports, whose sockets and wake-up pipe it
holds.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from typing import Protocol

import zmq

from loadax.client.transports.shared import Shared

log = logging.getLogger(__name__)

IO_THREADS = 2
"""The context's I/O threads: about one per GB/s a client receives, whatever its fleet."""


class Target(Protocol):
    """A user of the I/O thread: one worker's sockets."""

    def serve(self) -> bool:
        """Do what is due, on the I/O thread: whether more is due at once."""
        ...


class Watched(Protocol):
    """A plain socket the I/O thread watches beside the ZeroMQ ones."""

    def fileno(self) -> int: ...


class ZmqIo:
    """The context and the I/O thread of the process: `SHARED.acquire()` one, and release it."""

    def __init__(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context(IO_THREADS)
        self._selector = selectors.DefaultSelector()
        self._wake_in, self._wake_out = os.pipe()
        os.set_blocking(self._wake_in, False)
        os.set_blocking(self._wake_out, False)
        self._selector.register(self._wake_in, selectors.EVENT_READ)
        # `_lock` guards `_due`, `_woken` and `_stopping`, which any thread uses.
        self._lock = threading.Lock()
        self._due: dict[Target, None] = {}
        self._woken = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="loadax-zmq-io", daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        """Whether the caller is the I/O thread."""
        return threading.current_thread() is self._thread

    def wake(self, target: Target) -> None:
        """Have `target` served soon; from any thread. A RuntimeError once the thread's wake-up
        pipe is gone (a bug), saying whether the thread exited and was asked to."""
        with self._lock:
            self._due[target] = None
            if self._woken or self.on_thread():  # the thread looks at `_due` before it waits
                return
            self._woken = True
            stopping = self._stopping
        try:
            os.write(self._wake_out, b"\0")
        except OSError as error:
            exited = "has exited" if not self._thread.is_alive() else "still runs"
            asked = "was asked to stop" if stopping else "was not asked to stop"
            raise RuntimeError(
                f"cannot wake the process's ZeroMQ I/O thread ({error.strerror}): it {exited} "
                f"and {asked}"
            ) from error

    def watch(self, socket: zmq.Socket[bytes] | Watched, target: Target) -> None:
        """Serve `target` whenever `socket` may have changed (a ZeroMQ socket), or is readable
        (a plain one); on the I/O thread."""
        self._selector.register(socket, selectors.EVENT_READ, target)

    def unwatch(self, socket: zmq.Socket[bytes] | Watched) -> None:
        """Stop watching `socket`, before it is closed; on the I/O thread."""
        self._selector.unregister(socket)

    def close(self) -> None:
        """Stop the thread once every socket is unwatched, and end the context."""
        with self._lock:
            self._stopping = True
        os.write(self._wake_out, b"\0")
        if not self.on_thread():
            self._thread.join()

    def _run(self) -> None:
        busy: dict[Target, None] = {}  # served again without waiting
        try:
            while True:
                ready = dict(busy)
                busy.clear()
                with self._lock:
                    due = bool(self._due)
                for key, _ in self._selector.select(0 if ready or due else None):
                    if key.data is None:
                        self._drain_wake_ups()
                    else:
                        ready[key.data] = None
                with self._lock:
                    ready.update(self._due)
                    self._due.clear()
                    self._woken = False
                    stopping = self._stopping
                for target in ready:
                    if self._served(target):
                        busy[target] = None
                if stopping and not busy and len(self._selector.get_map()) == 1:
                    return
        finally:
            self._selector.close()
            os.close(self._wake_in)
            os.close(self._wake_out)
            self.context.term()

    def _served(self, target: Target) -> bool:
        """Serve `target`: whether more is due at once. One that raises (a bug in it) is
        logged and let go, its sockets unwatched, so that the others are served on."""
        try:
            return target.serve()
        except Exception:
            log.exception("the ZeroMQ I/O thread let go of %r: serving it failed", target)
            for key in list(self._selector.get_map().values()):
                if key.data is target:
                    self._selector.unregister(key.fileobj)
            return False

    def _drain_wake_ups(self) -> None:
        # Readable, so this does not block; a byte is written per wake-up, and `_woken` lets
        # one more come only once the wake-ups read here are taken: a few bytes at most.
        os.read(self._wake_in, 4096)


SHARED: Shared[ZmqIo] = Shared(ZmqIo, ZmqIo.close)
"""The process's ZeroMQ I/O."""
