"""loadax 0.2.1, the published predecessor, on W1, W2 and W3: its threaded `Dataloader` with 2
workers. Runs in its own environment, where `import loadax` is 0.2.1.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from harness import Setup, Trial, main
from workloads import examples, stack_records

WORKERS = 2


def dataloader(setup: Setup) -> Trial:
    # By name: this is loadax 0.2.1 from its own environment, not the loadax mypy checks against.
    old: Any = importlib.import_module("loadax")
    importlib.import_module("jax").process_count()  # start JAX's backend before the clock does
    spec = setup.workload
    source = examples(spec)
    dataset = old.MappedDataset(old.RangeDataset(0, spec.records), source.__getitem__)
    builder = (
        old.DataloaderBuilder(old.Batcher(stack_records))
        .batch_size(spec.batch_size)
        .workers(WORKERS)
        .prefetch(2)
    )

    def batches() -> Iterable[Any]:
        iterable: Iterable[Any] = builder.build(dataset)
        return iterable

    return Trial(batches, extra={"workers": WORKERS})


if __name__ == "__main__":
    main({"loadax 0.2.1": dataloader})
