"""How long a source keeps reading through a storage outage: `RetryPolicy`, and `retried`, which
runs one read under it."""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from loadax.errors import StorageError

R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of a read that failed with a transient storage error (the store unreachable,
    timing out, throttling or answering 5xx): at most `attempts` tries in all, the n-th retry
    after about `initial_s * 2**(n-1)` seconds (at most `longest_s`, jittered down by up to half so
    that many readers do not retry in step), and none that would start more than `total_s`
    seconds after the first failure. `RetryPolicy(attempts=1)` never retries.

    >>> from loadax import RetryPolicy
    >>> RetryPolicy()
    RetryPolicy(attempts=10, initial_s=0.5, longest_s=10.0, total_s=60.0)
    >>> [RetryPolicy().backoff(n) for n in range(1, 7)]
    [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    >>> RetryPolicy(initial_s=0)
    Traceback (most recent call last):
    ...
    ValueError: RetryPolicy: initial_s must be a number > 0, got 0
    """

    attempts: int = 10
    initial_s: float = 0.5
    longest_s: float = 10.0
    total_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ValueError(f"RetryPolicy: attempts must be an int >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy: attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("initial_s", "longest_s", "total_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"RetryPolicy: {name} must be a number > 0, got {value!r}")
        if self.longest_s < self.initial_s:
            raise ValueError(
                f"RetryPolicy: longest_s ({self.longest_s!r}) must be at least initial_s "
                f"({self.initial_s!r})"
            )

    def backoff(self, retry: int) -> float:
        """The longest wait before retry number `retry` (1 for the first), before jitter."""
        return float(min(self.longest_s, self.initial_s * 2 ** (retry - 1)))


DEFAULT_RETRIES = RetryPolicy()
"""The retries of a source given none: up to 10 attempts within a minute."""


def retried(action: Callable[[], R], policy: RetryPolicy) -> R:
    """`action()`, tried again under `policy` while it raises a transient `StorageError`; the
    last one is raised, saying how long it was retried. Every retry is logged as a warning naming
    the object, the attempt, the cause and the wait."""
    attempt, first_failure = 1, None
    while True:
        try:
            return action()
        except StorageError as error:
            if not error.transient:
                raise
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            wait = policy.backoff(attempt) * random.uniform(0.5, 1.0)
            if attempt == policy.attempts or now + wait - first_failure > policy.total_s:
                raise type(error)(
                    f"{error}; gave up after {attempt} attempts over {now - first_failure:.1f} s "
                    "(a dataset's retries=RetryPolicy(...) sets how long)",
                    error.url,
                    error.reason,
                    transient=True,
                ) from None
            log.warning(
                "%s (attempt %d of %d); retrying in %.2f s", error, attempt, policy.attempts, wait
            )
            time.sleep(wait)
            attempt += 1
