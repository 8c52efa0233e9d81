"""What a fleet simulation (`fleet_sim_run.Simulation`) reports once it has run: the trainers'
delivery, gaps and stalls, the fleet's extra load, connections and load spread, and the policy's
CPU (the keys of `fleet_sim.py`'s JSON)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet_sim_run import Simulation


def report(simulation: Simulation, wall_s: float) -> dict[str, Any]:
    world, end = simulation.world, simulation.world.seconds
    for trainer in simulation.trainers:  # still waiting when the run ends
        if trainer.finished is None and (trainer.current is not None or trainer.retrying):
            trainer.stalled += max(end - trainer.wanted_at, 0.0)
    demand = [end / trainer.step_s for trainer in simulation.trainers]
    gaps = sorted(gap for trainer in simulation.trainers for gap in trainer.gaps)
    requests = sum(len(trainer.sent_requests) for trainer in simulation.trainers)
    # Of the workers up from the start to the end: a killed or an added one serves less.
    steady = [
        worker
        for worker in itertools.islice(simulation.workers.values(), world.workers)
        if worker.state == "up"
    ]
    loads = [worker.requests for worker in steady]
    mean_load = sum(loads) / len(loads) if loads else 0.0
    connected = [trainer.policy.members for trainer in simulation.trainers]
    # Where the spread comes from: the apertures' cover of each worker (its shares of them,
    # summed, over the run), or how each trainer spreads its requests over its aperture.
    covers = [worker.cover for worker in steady]
    mean_cover = sum(covers) / len(covers) if covers else 0.0
    per_cover = [worker.requests / worker.cover for worker in steady if worker.cover]
    return {
        "workers": world.workers,
        "trainers": world.trainers,
        "seconds": end,
        "seed": world.seed,
        "delivered_fraction": sum(t.delivered for t in simulation.trainers) / sum(demand),
        "delivered_fraction_min": min(
            t.delivered / wanted for t, wanted in zip(simulation.trainers, demand, strict=True)
        ),
        "stall_fraction": sum(t.stalled for t in simulation.trainers) / (end * world.trainers),
        "p50_gap_s": _quantile(gaps, 0.5),
        "p99_gap_s": _quantile(gaps, 0.99),
        "max_gap_s": gaps[-1] if gaps else None,
        "max_gap_ended_at_s": max(t.longest_gap for t in simulation.trainers)[1] if gaps else None,
        "max_gap_after_fault_s": max(t.longest_after_fault for t in simulation.trainers)
        if world.faults
        else None,
        "first_batch_max_s": max(
            (t.first_batch for t in simulation.trainers if t.first_batch is not None), default=None
        ),
        "finished_max_s": None
        if any(t.finished is None for t in simulation.trainers)
        else max(t.finished for t in simulation.trainers if t.finished is not None),
        "requests": requests,
        "attempts": simulation.attempts,
        "extra_load": (simulation.attempts - requests) / requests if requests else 0.0,
        "failed_batches": sum(t.failures for t in simulation.trainers),
        "lost_attempts": simulation.lost,
        "refusals": simulation.refusals,
        "unreachable": simulation.unreachable,
        "connections_cap": simulation.options.subset,
        "connections_per_trainer_max": simulation.connections_per_trainer_max,
        "connections_per_worker_max": simulation.connections_per_worker_max,
        # At the end, from the policies' own members (the maxima above include start-up).
        "connections_per_trainer_end_max": max(map(len, connected)),
        "connections_per_worker_end_max": max(Counter(itertools.chain(*connected)).values()),
        "load_spread": max(loads) / mean_load if mean_load else None,
        "cover_spread": max(covers) / mean_cover if mean_cover else None,
        "requests_per_cover_spread": max(per_cover) / (sum(per_cover) / len(per_cover))
        if per_cover
        else None,
        "decisions": simulation.decisions,
        "ticks": simulation.ticks,
        "events": simulation.events,
        "policy_cpu_per_decision_s": simulation.policy_cpu / max(simulation.sampled, 1),
        "wall_s": wall_s,
    }


def _quantile(ordered: list[float], share: float) -> float | None:
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)] if ordered else None
