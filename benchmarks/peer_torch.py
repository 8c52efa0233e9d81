"""torch's DataLoader, the peer, on W1, W2 and W3: in the calling process, or with 2 worker
processes; numpy collation (no tensors), as a JAX user would set it up. Runs in the peers'
environment.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from harness import Setup, System, Trial, main
from workloads import examples, stack_records


def loader(workers: int) -> System:
    def system(setup: Setup) -> Trial:
        # By name: torch lives in the peers' environment only, not where mypy checks this file.
        data: Any = importlib.import_module("torch.utils.data")
        spec = setup.workload
        dataset = examples(spec)

        def batches() -> Iterable[Any]:
            iterable: Iterable[Any] = data.DataLoader(
                dataset, batch_size=spec.batch_size, num_workers=workers, collate_fn=stack_records
            )
            return iterable

        return Trial(batches, extra={"workers": workers})

    return system


SYSTEMS: dict[str, System] = {"torch 0w": loader(0), "torch 2w": loader(2)}

if __name__ == "__main__":
    main(SYSTEMS)
