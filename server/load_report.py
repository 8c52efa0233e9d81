"""What a worker's replies say of its load (`loadax.wire.load`): the batch requests its transport
was sent per second, by all its clients, per loading slot, and its slots."""

from __future__ import annotations

import dataclasses
import threading
import time

from loadax.validation import require_int
from loadax.wire.load import DecayingRate
from loadax.wire.payloads import EncodedBatch


class LoadReport:
    """The load of a transport with `slots` loading slots, counted from any thread.

    >>> report = LoadReport(slots=2)
    >>> report.arrived()
    >>> stamped = report.stamp(EncodedBatch(0, [b""]))
    >>> 0.0 < stamped.load <= 0.25, stamped.loading_slots
    (True, 2)
    """

    def __init__(self, slots: int) -> None:
        require_int("slots", slots, minimum=1)
        self.slots = slots
        """The batches the worker loads at once (its threads)."""
        self._arrivals = DecayingRate()
        self._lock = threading.Lock()

    def arrived(self) -> None:
        """A batch request arrived."""
        with self._lock:
            self._arrivals.add(time.monotonic())

    def stamp(self, batch: EncodedBatch) -> EncodedBatch:
        """`batch`, its reply carrying the load now."""
        with self._lock:
            load = self._arrivals.at(time.monotonic()) / self.slots
        return dataclasses.replace(batch, load=load, loading_slots=self.slots)
