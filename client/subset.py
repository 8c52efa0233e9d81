"""Which members of the fleet one client uses: its aperture, an arc of the ring of members.

The members, sorted by name, are the ring; a client sits at `Seat.position` on it (0 to 1) and
uses the arc of `width` members that starts there (deterministic aperture, as in Twitter's
Finagle). The clients of one job sit evenly around the ring (process `index` of `clients` at
`(index + offset) / clients`), so that when each arc is at least `members / clients` wide the
arcs cover the ring and every member is used by the same share of clients: an edge member of an
arc is used in proportion to how much of it the arc covers (its weight). A member added or
removed moves each arc by at most one member, so few connections move. Members that cannot be
used now are stepped over, and those failing are not counted: the arc reaches one member further
for each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence

from loadax.validation import require_int

MIN_WIDTH = 8
"""The narrowest arc (of a fleet that large): the share of one member that fails or is slow is
spread over the others, an eighth more each at most."""


@dataclasses.dataclass(frozen=True, slots=True)
class Seat:
    """Where a client sits on the ring: `position` in [0, 1), one of `clients` spread evenly.

    >>> Seat.of(1, 4, "job").position == (Seat.of(0, 4, "job").position + 0.25) % 1
    True
    """

    position: float = 0.0
    clients: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.position < 1.0:
            raise ValueError(f"a seat's position must be in [0, 1), got {self.position}")
        require_int("clients", self.clients, minimum=1)

    @classmethod
    def of(cls, index: int, clients: int, salt: str) -> Seat:
        """Process `index` of `clients` of a job named by `salt` (which turns the job's seats
        together, so that jobs are not all seated alike)."""
        require_int("index", index, minimum=0)
        if index >= clients:
            raise ValueError(f"process index {index} is not below the process count {clients}")
        turn = int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "big")
        return cls((index / clients + turn / 2**64) % 1.0, clients)

    def cover(self, members: int) -> float:
        """How wide this client's arc must be for the job's arcs to cover `members`."""
        return members / self.clients


def aperture(
    ring: Sequence[str],
    seat: Seat,
    width: float,
    usable: Callable[[str], bool],
    at_most: int | None = None,
    counted: Callable[[str], bool] = lambda name: True,
) -> dict[str, float]:
    """The members of the arc of `width` members (sorted `ring`) from `seat`, stepping over
    those not `usable`, each with the share of it the arc covers (0 to 1]; `at_most` of them
    (the arc ends sooner). A member not `counted` is in the arc but takes none of its width.

    >>> aperture(["a", "b", "c", "d"], Seat(0.125), 2.0, lambda name: True)
    {'a': 0.5, 'b': 1.0, 'c': 0.5}
    >>> aperture(["a", "b", "c", "d"], Seat(0.0), 2.0, lambda name: name != "a")
    {'b': 1.0, 'c': 1.0}
    """
    count = len(ring)
    if not count or width <= 0:
        return {}
    start = seat.position * count
    first = math.floor(start)
    left = min(width, count)
    cut = 0.0 if width >= count else start - first  # of the first member, before the arc
    arc: dict[str, float] = {}
    for step in range(count):
        name = ring[(first + step) % count]
        if not usable(name):
            continue
        share = min(1.0 - cut, left)
        cut = 0.0
        arc[name] = share
        if counted(name):
            left -= share
        if left <= 1e-9 or len(arc) == at_most:
            break
    return arc
