"""Warnings about what clients do, at most one line per client and kind per interval: a client
that misbehaves in a loop cannot flood the worker's log. Lines held back are counted, and the
next line written for that client and kind says how many there were."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

INTERVAL_S = 10.0
"""The least time between two lines of one client and kind."""
_MAX_KEYS = 4096  # clients and kinds remembered (least recently used go first): clients choose them


class ThrottledLog:
    """Writes `warning(key, ...)` to `logger` when `key` (e.g. (client, kind)) had no line in the
    last `interval` seconds; otherwise counts it.

    >>> import logging
    >>> from loadax.server.throttled_log import ThrottledLog
    >>> now = [0.0]
    >>> throttled = ThrottledLog(logging.getLogger("example"), 10.0, clock=lambda: now[0])
    >>> [throttled.warning("client a", "refused") for _ in range(3)]
    [True, False, False]
    >>> now[0] = 11.0
    >>> throttled.warning("client a", "refused"), throttled.held_back("client a")
    (True, 0)
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger, self._interval, self._clock = logger, interval, clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()

    def warning(
        self,
        key: Hashable,
        message: str,
        *args: object,
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        """Log `message % args` (with the record's fields `extra`, `loadax.logfields`) unless
        `key` had a line within the interval; whether it did."""
        now = self._clock()
        with self._lock:
            last, held = self._keys.get(key, (None, 0))
            if last is not None and now - last < self._interval:
                self._keys[key] = (last, held + 1)
                self._keys.move_to_end(key)
                return False
            self._keys[key] = (now, 0)
            self._keys.move_to_end(key)
            while len(self._keys) > _MAX_KEYS:
                self._keys.popitem(last=False)
        if held:
            message += " (and %d more like it in the last %.0f s, not logged)"
            args = (*args, held, now - (last or now))
        self._logger.warning(message, *args, extra=extra)
        return True

    def held_back(self, key: Hashable) -> int:
        """How many lines of `key` were counted and not written since its last line."""
        with self._lock:
            return self._keys.get(key, (0.0, 0))[1]
