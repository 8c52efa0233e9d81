"""How busy a worker is, as its replies tell its clients: the batch requests it was sent per
second and per loading slot, by all its clients, as a rate that decays with `LOAD_TAU_S`
(`BatchResponse.load`, beside its slots, `BatchResponse.loading_slots`).

A client keeps the same rate of what it sent each member itself. What the others send a member
is then its reported load less this client's share, and the client sends its next request where
the load would be least (`loadax.client.member_choice`): each client fills the members it uses
up to the same level, so that trainers whose subsets overlap level the fleet between them
(a straggler's neighbours are left by the trainers that have others to go to). Both ends use
this one rate, so the two halves of that subtraction count alike.
"""

from __future__ import annotations

import math

LOAD_TAU_S = 2.0
"""The time constant of a load: each request counts 1 / LOAD_TAU_S at once, decaying by e every
LOAD_TAU_S seconds, so a steady N requests a second reads N."""


class DecayingRate:
    """Events per second, counting each `add` at once and forgetting it exponentially (not
    thread-safe: one owner adds and reads).

    >>> rate = DecayingRate()
    >>> for second in range(20):
    ...     rate.add(float(second))
    >>> round(rate.at(19.0), 2), round(rate.at(19.999), 2)  # one a second: about 1 between
    (1.27, 0.77)
    >>> rate.at(19.0 + 10 * LOAD_TAU_S) < 1e-4
    True
    """

    __slots__ = ("_at", "_rate")

    def __init__(self) -> None:
        self._rate = 0.0
        self._at = 0.0

    def at(self, now: float) -> float:
        """The rate at `now` (not before the last `add`)."""
        return self._rate * math.exp(-max(now - self._at, 0.0) / LOAD_TAU_S)

    def add(self, now: float, count: float = 1.0) -> None:
        self._rate = self.at(now) + count / LOAD_TAU_S
        self._at = max(now, self._at)
