"""The servers' handler threads: as many as the requests being handled, up to a bound, each
leaving once it has been idle a while, so that a worker's threads return to their idle count
after a crowd of clients has gone (a `ThreadPoolExecutor` keeps every thread it ever started).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from loadax.validation import require_int, require_positive

P = ParamSpec("P")
R = TypeVar("R")
IDLE_S = 1.0
"""How long a handler thread waits for work before it leaves."""


class HandlerPool(Executor):
    """Runs what is submitted on up to `threads` threads (named `name`-N), started as work
    comes when none is idle; a thread idle for `idle_s` seconds exits. Work beyond `threads`
    at once waits in submission order.

    >>> import time
    >>> pool = HandlerPool(4, "example", idle_s=0.05)
    >>> [future.result() for future in [pool.submit(pow, 2, n) for n in range(4)]]
    [1, 2, 4, 8]
    >>> time.sleep(0.5); pool.threads
    0
    >>> pool.shutdown()
    """

    def __init__(self, threads: int, name: str, *, idle_s: float = IDLE_S) -> None:
        require_int("threads", threads, minimum=1)
        require_positive("idle_s", idle_s)
        self._max, self._name, self._idle_s = threads, name, idle_s
        self._changed = threading.Condition()
        self._work: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._started = 0
        self._shut = False

    @property
    def threads(self) -> int:
        """The threads running now, busy or idle."""
        with self._changed:
            return len(self._threads)

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        future: Future[R] = Future()
        with self._changed:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.append((future, lambda: fn(*args, **kwargs)))
            if len(self._work) > self._idle and len(self._threads) < self._max:
                self._started += 1
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}-{self._started}", daemon=True
                )
                self._threads.add(thread)
                thread.start()
            else:
                self._changed.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._changed:
                leave_at = time.monotonic() + self._idle_s
                while not self._work and not self._shut:
                    rest = leave_at - time.monotonic()
                    if rest <= 0:
                        break
                    self._idle += 1
                    self._changed.wait(rest)
                    self._idle -= 1
                if not self._work:
                    self._threads.discard(threading.current_thread())
                    if self._shut:
                        self._changed.notify_all()  # for shutdown(wait=True)
                    return
                future, call = self._work.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as error:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            del future, call  # what they hold is not kept while the thread waits

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; with `cancel_futures`, cancel what has not started; with `wait`,
        return once every thread has exited (after the work queued)."""
        with self._changed:
            self._shut = True
            if cancel_futures:
                while self._work:
                    self._work.popleft()[0].cancel()
            self._changed.notify_all()
            if wait:
                self._changed.wait_for(lambda: not self._threads)
