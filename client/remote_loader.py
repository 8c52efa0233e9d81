"""`RemoteLoader`: what `RemoteDataLoader.build()` makes, a loader whose batches workers make.

It binds its membership to one pipeline identity, runs the fleet's driver, and hands the shared
`Loader` an executor that sends each step's work to the fleet (`RemoteExecutor`); with local
members, the trainer's own cores join the fleet (`LocalMembers`).
"""

from __future__ import annotations

import dataclasses
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from loadax.buffers import BufferPool
from loadax.client.demand import DemandMeter
from loadax.client.driver import Driver
from loadax.client.fleet_options import FleetOptions
from loadax.client.job import agree, job_seat, mesh_processes, row_groups
from loadax.client.local_members import LocalMembers, LocalSpec, LocalWorker
from loadax.client.member import Identity, handshake_request
from loadax.client.membership import DIAGNOSIS_S, Membership
from loadax.client.names import Resolver, resolve_host
from loadax.client.remote_executor import RemoteExecutor
from loadax.client.security import ClientSecurity
from loadax.client.spare_cores import (
    LoopExecutor,
    LoopTuner,
    SpareCores,
    cores_left,
    spare_cores,
)
from loadax.client.transports import TargetSpec, connect
from loadax.client.transports.diagnosis import diagnose
from loadax.client.transports.memory_files import MemoryFiles
from loadax.execution.executor import Executor
from loadax.iterators.stats import LoaderStats, StatsRecorder
from loadax.loader import DEFAULT_PREFETCH, Loader, LoaderOptions


class RemoteLoader(Loader[Any]):
    """A loader definition served by workers; `close()` (or collection) closes the connections.

    Workers can be added and removed while iterators run; the batches do not change.

    >>> from loadax import Batcher, Pipeline, RangeDataset
    >>> from loadax.client import RemoteDataLoader
    >>> from loadax.server.worker import Worker
    >>> worker = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> loader = RemoteDataLoader([worker], pipeline="numbers").batch_size(2).build()
    >>> loader.targets, len(loader)
    (['in-process Worker'], 3)
    >>> [batch.tolist() for batch in loader], loader.stats().batches
    ([[0, 1], [2, 3], [4, 5]], 3)
    >>> loader.close()
    >>> worker.close()
    """

    def __init__(
        self,
        specs: Sequence[TargetSpec],
        pipeline: str,
        options: LoaderOptions,
        failover: FleetOptions,
        *,
        resolver: Resolver = resolve_host,
        resolve_every: float = 30.0,
        security: ClientSecurity | None = None,
        pinned: str | None = None,
        local: LocalSpec | None = None,
        demand: DemandMeter | None = None,
    ) -> None:
        self._stats = stats = StatsRecorder()
        self._demand = demand or DemandMeter()
        buffers = BufferPool()  # the members' batches are received into these
        files = MemoryFiles()  # or written into these, by members on this host
        processes = mesh_processes(options.mesh)
        groups = row_groups(options.mesh, options.data_axis)
        if failover.affinity == "auto":  # on where this job's own processes ask alike
            failover = dataclasses.replace(
                failover, affinity=any(len(group) > 1 for group in groups)
            )
        seat = job_seat(pipeline, groups)
        # The handshake checks the plan's parameters: length buckets stay with the client.
        unbucketed = dataclasses.replace(options, buckets=None)
        self._membership = membership = Membership(
            specs,
            pipeline,
            lambda records: handshake_request(pipeline, unbucketed.plan(records)),
            connect=lambda spec: connect(
                spec, security, buffers, shared_memory=failover.shared_memory, files=files
            ),
            resolver=resolver,
            timeout=failover.startup_timeout,
            give_up_after=failover.give_up_after,
            diagnose=lambda address: diagnose(address, DIAGNOSIS_S, security),
            seat=seat,
            subset=failover.subset,
        )
        self._driver = driver = Driver(failover, seat=seat, connect=membership.connect_member)
        usable = spare_cores()

        def left() -> int | None:
            """The cores that workers on this host leave the local members now."""
            return cores_left(usable, driver.same_host_slots)

        try:
            worker = None if local is None else LocalWorker.of(local, pipeline)
            fallback = None if worker is None else worker.identity
            self._identity = identity = membership.bind(
                failover.min_workers, driver, pinned, fallback
            )
            agree(
                pipeline,
                identity,
                driver.members,
                processes,
                failover.startup_timeout,
            )
            locals_, rule = None, None
            if local is not None and worker is not None:
                handshake = handshake_request(pipeline, options.plan(identity.num_records))
                if isinstance(local.count, int):
                    count = local.count
                else:  # "auto": every core at once unless a worker elsewhere can be measured
                    rule = SpareCores(usable)
                    sidecar = local.same_host == "worker" and driver.same_host
                    count = rule.start(elsewhere=driver.off_host or sidecar, left=left())
                locals_ = LocalMembers(local, worker, pipeline, identity, handshake, driver, count)
            plan = options.plan(identity.num_records)
        except BaseException:
            membership.close(every=True)
            driver.close()
            files.close()
            raise
        fingerprint, budget = identity.fingerprint, failover.memory_budget_mb << 20
        client = uuid.uuid4().hex  # this loader's, whatever connections it shares

        # A worker on this host counts as the trainer's cores, unless it has cores of its own.
        counted = local is not None and local.same_host == "fallback"
        same_host = (lambda: driver.same_host) if counted else (lambda: False)
        tuner = LoopTuner(self._demand, rule, same_host, left)
        resize = locals_.resize if locals_ is not None else lambda count: None

        def executor() -> Executor[Any]:
            remote = RemoteExecutor(driver, pipeline, fingerprint, stats, budget, client)
            return LoopExecutor(remote, tuner, resize)

        super().__init__(
            plan,
            options,
            executor,
            prefetch=options.prefetch or DEFAULT_PREFETCH,
            stream_window=identity.stream_window or None,
            stats=stats,
        )
        self._finalizer = weakref.finalize(self, _close, membership, driver, files, locals_)
        membership.refresh_every(resolve_every, lambda: driver.known)

    @property
    def targets(self) -> list[str]:
        """The names of the members connected (see `RemoteDataLoader.subset`)."""
        return self._driver.members

    @property
    def identity(self) -> Identity:
        """The pipeline identity the loader is bound to: no other's batch is ever used."""
        return self._identity

    def fingerprint(self) -> str:
        """The fingerprint of the bound identity: a local loader of the same pipeline has it."""
        return self.identity.fingerprint

    def stats(self) -> LoaderStats:
        """Batches, bytes and rates since the first request, the share of that time the
        training loop waited for data, each worker in use's requests, failures, latency and
        quarantine, and the targets left out for what they answered; the recent share of the
        time the loop waited and the workers wanted (see `RemoteDataLoader.sizing`)."""
        stats = self._stats.snapshot(
            self._driver.member_stats(), self._membership.left_out, self._driver.reuse.snapshot(0)
        )
        demand = self._demand.measure(self._driver.rates.capacities(), self._stats.clock())
        return dataclasses.replace(
            stats, input_stall_fraction=demand.stall, workers_wanted=demand.workers_wanted
        )

    def add_target(self, spec: TargetSpec) -> None:
        """Start using another worker, after checking it serves the loader's pipeline identity:
        a ValueError naming both identities if not, the worker's error if it cannot serve."""
        self._membership.add(spec)

    def remove_target(self, name: str) -> None:
        """Stop using a worker; the requests it held are sent to the others."""
        self._membership.remove(name, self._driver.known)

    def refresh(self) -> None:
        """Look the target names up again; add the addresses that appeared, drop those gone."""
        self._membership.refresh(self._driver.known)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close(
    membership: Membership, driver: Driver, files: MemoryFiles, local: LocalMembers | None
) -> None:
    membership.close()
    driver.close()
    if local is not None:
        local.close()
    files.close()
