"""Grain, the peer, on W1, W2 and W3: its Dataset API (batches made by its read threads, or by 2
processes with `mp_prefetch`) and its DataLoader. Per-record randomness is Grain's own
`random_map`. Runs in the peers' environment.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from harness import Setup, System, Trial, main
from workloads import SEED, raw_records, spectrum, stack_records, w2_example

# By name: Grain lives in the peers' environment only, not where mypy checks this file.
grain: Any = importlib.import_module("grain")


def mapped(setup: Setup) -> Any:
    """The workload's records as a Grain `MapDataset`, transformed."""
    spec = setup.workload
    records = grain.MapDataset.source(raw_records(spec))
    if spec.name == "W2":
        return records.random_map(w2_example, seed=SEED)
    if spec.name == "W3":
        return records.map(spectrum)
    return records


def dataset(processes: int) -> System:
    """Batched before `to_iter_dataset`, so that each read thread makes whole batches: much
    faster than batching the threads' records one at a time."""

    def system(setup: Setup) -> Trial:
        def batches() -> Iterable[Any]:
            batch_size = setup.workload.batch_size
            batched = mapped(setup).batch(batch_size, batch_fn=stack_records).to_iter_dataset()
            if processes:
                batched = batched.mp_prefetch(grain.MultiprocessingOptions(num_workers=processes))
            iterable: Iterable[Any] = batched
            return iterable

        return Trial(batches, extra={"processes": processes})

    return system


def operation(base: Any, method: str, fn: Callable[..., Any]) -> Any:
    """An instance of Grain transform class `base` whose `method` calls `fn`.

    Made with `type()`: the base class exists only at run time, in the peers' environment.
    """
    return type(fn.__name__, (base,), {method: lambda self, *args: fn(*args)})()


def data_loader(setup: Setup) -> Trial:
    spec = setup.workload
    operations = []
    if spec.name == "W2":
        operations.append(operation(grain.transforms.RandomMap, "random_map", w2_example))
    elif spec.name == "W3":
        operations.append(operation(grain.transforms.Map, "map", spectrum))
    operations.append(grain.transforms.Batch(spec.batch_size, batch_fn=stack_records))
    sampler = grain.samplers.IndexSampler(spec.records, shuffle=False, num_epochs=1, seed=SEED)

    def batches() -> Iterable[Any]:
        iterable: Iterable[Any] = grain.DataLoader(
            data_source=raw_records(spec), sampler=sampler, operations=operations, worker_count=0
        )
        return iterable

    return Trial(batches)


SYSTEMS: dict[str, System] = {
    "grain Dataset": dataset(0),
    "grain Dataset mp_prefetch(2)": dataset(2),
    "grain DataLoader": data_loader,
}

if __name__ == "__main__":
    main(SYSTEMS)
