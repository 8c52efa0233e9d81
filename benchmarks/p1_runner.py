"""P1 in the suite: `plan_bench.py`'s shuffled plan over 10**10 records, one batch size per
system; the timed batches are `Plan.indices` of steps spread over three epochs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness import Setup, System, Trial, main
from plan_bench import MEMORY_RECORDS, measure_memory, sample_steps, shuffled_plan


def indices(batch_size: int, steps_per_epoch: int) -> System:
    def system(setup: Setup) -> Trial:
        plan = shuffled_plan(setup.workload.records, batch_size)
        steps = sample_steps(plan, steps_per_epoch)
        plan.indices(steps[0])  # warm-up: first-call costs are not throughput
        peaks = {
            str(records): measure_memory(records, batch_size).peak_bytes
            for records in MEMORY_RECORDS
        }

        def batches() -> Iterable[Any]:
            return (plan.indices(step) for step in steps)

        return Trial(batches, extra={"batch_size": batch_size, "peak_bytes_by_records": peaks})

    return system


SYSTEMS: dict[str, System] = {
    "Plan.indices batch 1048576": indices(1 << 20, 3),
    "Plan.indices batch 4096": indices(4096, 100),
}

if __name__ == "__main__":
    main(SYSTEMS)
