"""The fleet driver's inbox (`client.driver`): every item for its passes in the order it came,
and the wake-ups of the thread that waits for them."""

from __future__ import annotations

import contextlib
import queue
import time
from collections import deque
from typing import Any


class Inbox:
    """Items in the order they came; `post` wakes the waiting thread, `put` does not (the item
    waits for the next pass, whatever wakes it)."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, item: Any) -> None:
        self._items.append(item)

    def post(self, item: Any) -> None:
        self._items.append(item)
        self.wake()

    def wake(self) -> None:
        self._wakeups.put(None)

    def quiet(self) -> bool:
        """Whether no wake-up is waiting."""
        return self._wakeups.empty()

    def wait(self, until: float | None) -> None:
        """Until a wake-up comes (taking every one waiting) or the clock reaches `until` (None:
        no deadline)."""
        timeout = None if until is None else max(until - time.monotonic(), 0.0)
        with contextlib.suppress(queue.Empty):
            self._wakeups.get(timeout=timeout)
            while True:
                self._wakeups.get_nowait()

    def take(self) -> list[Any]:
        """Every item waiting, in order."""
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items
