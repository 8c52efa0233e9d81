"""One handle per reading thread, for the file sources whose readers no two threads may share.

SQLite connections, Parquet files and ArrayRecord readers all need it, so it is written once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

H = TypeVar("H")


class HandlePool(Generic[H]):
    """Each thread's own handle, from `open()` on the thread's first `get()`, reused after.

    `close()` closes the handles of every thread, with `close(handle)`, those of threads that have
    finished too; a later `get()` opens a new one. A pickled pool arrives empty, since a handle
    belongs to the process that opened it: the copy opens its own.

    >>> import io
    >>> import threading
    >>> from loadax.sources.handles import HandlePool
    >>> pool = HandlePool(io.BytesIO, io.BytesIO.close)
    >>> handle = pool.get()
    >>> pool.get() is handle
    True
    >>> other = threading.Thread(target=pool.get)
    >>> other.start()
    >>> other.join()
    >>> len(pool), pool.handles()[0] is handle
    (2, True)
    >>> pool.close()
    >>> handle.closed, len(pool), pool.get() is handle
    (True, 0, False)
    >>> pool.close()
    """

    def __init__(self, open: Callable[[], H], close: Callable[[H], object]) -> None:
        self._open = open
        self._close = close
        self._lock = threading.Lock()
        self._local = threading.local()
        self._handles: list[H] = []  # every thread's, so close() reaches finished threads' too

    def __len__(self) -> int:
        """The number of open handles: one per thread that has called `get()` since `close()`."""
        with self._lock:
            return len(self._handles)

    def handles(self) -> tuple[H, ...]:
        """Every thread's open handle, in the order they were opened."""
        with self._lock:
            return tuple(self._handles)

    def get(self) -> H:
        """This thread's handle, opened now if the thread has none since the pool was closed."""
        try:
            handle: H = self._local.handle
        except AttributeError:
            handle = self._open()
            with self._lock:
                # The current local: if close() ran while this opened, the next one closes it.
                self._local.handle = handle
                self._handles.append(handle)
        return handle

    def close(self) -> None:
        """Close every thread's handle, in the order they were opened; `get()` opens new ones."""
        with self._lock:
            handles, self._handles = self._handles, []
            self._local = threading.local()
        for handle in handles:
            self._close(handle)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._open, self._close))
