"""loadax's systems: local loading with 0 or 2 worker threads (W1, W2, W3, and R1's local mode),
and a `RemoteDataLoader` over gRPC or ZeroMQ to 1 or 2 running `loadax-worker`s (R1, T1).

Remote systems take the workers' addresses from the driver: `--option grpc=ADDR,ADDR` and
`--option zmq=ADDR,ADDR`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bench_pipelines import pipeline
from harness import Setup, System, Trial, main
from workloads import REMOTE_PIPELINES

import loadax
from loadax.client import RemoteDataLoader, RemoteLoader
from loadax.client.fleet_options import FleetOptions
from loadax.loader import DEFAULT_PREFETCH


def local(workers: int) -> System:
    def system(setup: Setup) -> Trial:
        spec = setup.workload
        served = pipeline(spec)
        builder = loadax.DataLoader(served.batcher).batch_size(spec.batch_size).workers(workers)

        def batches() -> Iterable[Any]:
            return builder.build(served.dataset)

        return Trial(batches, extra={"workers": workers})

    return system


def remote(transport: str, workers: int, shared_memory: bool = True) -> System:
    """A client with default settings of the first `workers` of the workers the driver
    started; it holds `prefetch` ready batches and 2 requests per worker in flight. Without
    `shared_memory`, batches come over the sockets, as from workers on other hosts."""

    def system(setup: Setup) -> Trial:
        spec = setup.workload
        targets = setup.option(transport).split(",")[:workers]
        prefetch = DEFAULT_PREFETCH + FleetOptions().in_flight_per_worker * len(targets)
        builder = (
            RemoteDataLoader(targets, pipeline=REMOTE_PIPELINES[spec.name])
            .batch_size(spec.batch_size)
            .shared_memory(shared_memory)
        )
        loaders: list[RemoteLoader] = []

        def batches() -> Iterable[Any]:
            loaders.append(builder.build())  # connects and handshakes: part of the first batch
            return loaders[-1]

        def close() -> None:
            for loader in loaders:
                loader.close()

        extra = {"workers": len(targets), "prefetch": prefetch, "shared_memory": shared_memory}
        return Trial(batches, close, prefetch, extra)

    return system


SYSTEMS: dict[str, System] = {
    "loadax 0w": local(0),
    "loadax 2w": local(2),
    "loadax gRPC 1w": remote("grpc", 1),
    "loadax gRPC 2w": remote("grpc", 2),
    "loadax ZeroMQ 1w": remote("zmq", 1),
    "loadax ZeroMQ 2w": remote("zmq", 2),
    "loadax gRPC": remote("grpc", 1),
    "loadax ZeroMQ": remote("zmq", 1),
    "loadax gRPC sockets": remote("grpc", 1, shared_memory=False),
    "loadax ZeroMQ sockets": remote("zmq", 1, shared_memory=False),
}

if __name__ == "__main__":
    main(SYSTEMS)
