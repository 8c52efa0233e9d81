"""How a remote loader places and sees through its requests: `FleetOptions`, set by the builder."""

from __future__ import annotations

import dataclasses
from typing import Literal

from loadax.validation import require_int, require_positive


@dataclasses.dataclass(frozen=True, slots=True)
class FleetOptions:
    """How requests are placed and seen through (seconds for times):

    - `request_timeout`: the most one attempt may take; below it, an attempt is given up as hung
      once it is `HUNG_FACTOR` x the fleet's p95 latency old.
    - `hedge_after`: "auto" hedges at `HEDGE_FACTOR` x p95; a number, at that age; None, never.
    - `no_worker_timeout`: how long the fleet may answer nothing (or fail one request) before
      iteration raises.
    - `in_flight_per_worker`: requests kept outstanding per healthy worker (within its limit).
    - `memory_budget_mb`: the most batch bytes an iterator holds, outstanding and ready.
    - `startup_timeout`: how long `build()` waits for `min_workers` targets to agree;
      `give_up_after`: sooner, how long every target may have failed for good (None: never).
    - `subset`: the most members connected at once (`loadax.client.subset`); the policy uses
      fewer while they keep up, and reaches past them when they fail.
    - `poison_retries`: how many more workers are asked work that killed or stalled one.
    - `backoff_*`, `quarantine_*`: how long a failed or a quarantined worker is kept off,
      doubling from the initial value up to the maximum.
    - `shared_memory`: whether workers on this host write batches into this process's memory
      rather than send them (`loadax.wire.shared_memory`).
    - `affinity`: whether placement breaks ties of load by each request's digest
      (`loadax.client.affinity`), so that clients asking for the same batches meet on a worker;
      "auto": for the processes of a job that own the same rows (`RemoteLoader` decides).
    """

    request_timeout: float = 60.0
    hedge_after: float | Literal["auto"] | None = "auto"
    no_worker_timeout: float = 60.0
    in_flight_per_worker: int = 2
    memory_budget_mb: int = 1024
    startup_timeout: float = 30.0
    give_up_after: float | None = 10.0
    min_workers: int = 1
    subset: int = 64
    poison_retries: int = 1
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    quarantine_initial: float = 1.0
    quarantine_max: float = 4.0
    shared_memory: bool = True
    affinity: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        for name in (
            "request_timeout",
            "no_worker_timeout",
            "startup_timeout",
            "backoff_initial",
            "backoff_max",
            "quarantine_initial",
            "quarantine_max",
        ):
            require_positive(name, getattr(self, name), unit="seconds")
        if self.give_up_after is not None:
            require_positive("give_up_after", self.give_up_after, unit="seconds")
        if self.hedge_after not in (None, "auto"):
            require_positive("hedge_after", self.hedge_after, unit="seconds")
        for name in ("in_flight_per_worker", "memory_budget_mb", "min_workers", "subset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        require_int("poison_retries", self.poison_retries, minimum=0)
        if not isinstance(self.shared_memory, bool):
            raise ValueError(f"shared_memory must be True or False, got {self.shared_memory!r}")
        if not isinstance(self.affinity, bool) and self.affinity != "auto":
            raise ValueError(f"affinity must be True, False or 'auto', got {self.affinity!r}")
