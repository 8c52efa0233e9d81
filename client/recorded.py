"""A driven run's record (`Driver(record=...)`) and its replay: the policy depends on nothing but
its events and their times, so a new one makes the run's own decisions from them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loadax.client.fleet_events import Action, Event
from loadax.client.fleet_options import FleetOptions
from loadax.client.policy import Policy

Recorded = tuple[float, Event, list[Action]]
"""One step of a recorded run: when, the event, and the actions the policy decided."""


def replay(
    options: FleetOptions, recorded: Iterable[tuple[float, Event, Any]]
) -> list[list[Action]]:
    """The decisions a new policy makes from the events of a recorded run, at their times: the
    run's own decisions, since the policy depends on nothing else."""
    policy = Policy(options)
    return [policy.decide(event, now) for now, event, _ in recorded]
