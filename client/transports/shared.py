"""What every transport of a process shares, so that a client's threads and file descriptors do
not grow with its fleet: `Shared`, one resource per process, made for its first user and closed
after its last."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Shared(Generic[T]):
    """One resource per process, made by `make` for its first user and closed by `close` after
    its last has released it (no threads are left behind once a client's transports are closed).
    A forked child makes its own: its parent's threads did not follow it, and a ZeroMQ context
    must not be used across a fork.

    >>> made = []
    >>> shared = Shared(lambda: made.append(1) or len(made), lambda _: made.append(0))
    >>> first, second = shared.acquire(), shared.acquire()
    >>> first == second == 1
    True
    >>> shared.release(first); made
    [1]
    >>> shared.release(second); made
    [1, 0]
    >>> shared.acquire()
    3
    """

    def __init__(self, make: Callable[[], T], close: Callable[[T], None]) -> None:
        self._make, self._close = make, close
        self._lock = threading.Lock()
        self._resource: T | None = None
        self._pid = 0
        self._users = 0

    def acquire(self) -> T:
        """The process's resource, made if it has none; `release` it when done with it."""
        with self._lock:
            if self._resource is None or self._pid != os.getpid():
                self._resource, self._pid, self._users = self._make(), os.getpid(), 0
            self._users += 1
            return self._resource

    def release(self, resource: T) -> None:
        """Done with `resource`; it is closed if it was its last user (on this thread). One of
        a parent process, or released already, is left alone."""
        with self._lock:
            if resource is not self._resource or self._pid != os.getpid():
                return
            self._users -= 1
            if self._users:
                return
            self._resource = None
        self._close(resource)
