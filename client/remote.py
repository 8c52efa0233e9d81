"""`RemoteDataLoader`: the local loader's builder and iterator, with batches made by workers.

The client sends plan parameters, step numbers and rows, never code. The fleet is four pieces:
`membership` (who is in it), `policy` (which member gets each request), `driver` (the thread that
runs the policy) and `transports` (that move the bytes). The shared `BatchIterator` yields
batches in step order, so the batches and the checkpoint state are exactly the local loader's.
The loader binds to one pipeline identity at build and never uses a member that serves another.

How far ahead it loads: `prefetch` batches ready for the training loop plus an in-flight depth of
`in_flight_per_worker` requests per healthy worker (within each worker's announced
`max_in_flight_per_client`), all within `memory_budget_mb` of batches held. Requests beyond the
depth wait in the policy and go out as answers come in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Self

from loadax.client.demand import DEFAULT_STALL_TARGET, DEFAULT_WINDOW_S, DemandMeter
from loadax.client.fleet_options import FleetOptions
from loadax.client.local_members import Kind, LocalSpec, SameHost
from loadax.client.names import Resolver, resolve_host
from loadax.client.remote_loader import RemoteLoader
from loadax.client.security import ClientSecurity
from loadax.client.transports import TargetSpec, check_spec
from loadax.execution.pipeline import Pipeline
from loadax.loader import LoaderBuilder, LoaderOptions
from loadax.plan.buckets import LengthsOf
from loadax.wire.limits import MAX_LISTED_ROWS


class RemoteDataLoader(LoaderBuilder):
    """Builds a loader whose batches are made by workers:

    `RemoteDataLoader(["grpc://host:50051"], pipeline="images").batch_size(256).build()`

    A target whose host is a name stands for every address the name lists; the name is looked
    up again every `resolve_every` seconds and workers are added and removed to match.
    `security` sets TLS, CURVE and a token for every connection (see SECURITY.md).

    A worker object is a target too, served in-process without sockets:

    >>> from loadax import Batcher, Pipeline, RangeDataset
    >>> from loadax.client import RemoteDataLoader
    >>> from loadax.server.worker import Worker
    >>> worker = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    >>> builder = RemoteDataLoader([worker], pipeline="numbers").request_timeout(10)
    >>> with builder.batch_size(4).build() as loader:
    ...     [batch.tolist() for batch in loader]
    [[0, 1, 2, 3], [4, 5]]
    >>> worker.close()
    """

    def __init__(
        self,
        targets: Sequence[TargetSpec],
        pipeline: str,
        *,
        resolver: Resolver = resolve_host,
        resolve_every: float = 30.0,
        security: ClientSecurity | None = None,
    ) -> None:
        super().__init__()
        if isinstance(targets, str) or not targets:
            raise ValueError("targets must be a non-empty list of addresses or worker objects")
        for target in targets:
            check_spec(target)
        if not isinstance(pipeline, str) or not pipeline:
            raise ValueError(f"pipeline must be a pipeline name, got {pipeline!r}")
        self._targets, self._pipeline = list(targets), pipeline
        self._resolver, self._resolve_every = resolver, resolve_every
        self._security = security
        self._failover = FleetOptions()
        self._pinned: str | None = None
        self._local: LocalSpec | None = None
        self._demand = (DEFAULT_STALL_TARGET, DEFAULT_WINDOW_S)

    def prefetch(self, batches: int) -> Self:
        """Batches kept ready ahead of the training loop, on top of the requests in flight at
        the workers (see `in_flight_per_worker`). Default 2."""
        return self._with(prefetch=batches)

    def in_flight_per_worker(self, requests: int) -> Self:
        """Requests kept outstanding at each healthy worker, never more than the worker allows
        one client (its `max_in_flight_per_client`). Default 2: one being made while the other
        travels."""
        return self._with_failover(in_flight_per_worker=requests)

    def memory_budget_mb(self, megabytes: int) -> Self:
        """The most batch bytes one iterator holds, in flight and ready, in MiB (it lowers the
        look-ahead once the batches' size is known). Default 1024."""
        return self._with_failover(memory_budget_mb=megabytes)

    def startup(
        self, timeout: float = 30.0, min_workers: int = 1, give_up_after: float | None = 10.0
    ) -> Self:
        """`build()` proceeds once `min_workers` targets agree on the pipeline identity (and the
        others had a second more), and fails after `timeout` seconds naming each target
        and what it said; targets not up by then join when they answer. It fails sooner, after
        `give_up_after` seconds, when every target has failed in a way that waiting does not
        mend (connection refused, a name that does not exist, a port of another protocol);
        None waits the whole `timeout` (workers started well after the trainer)."""
        return self._with_failover(
            startup_timeout=timeout, min_workers=min_workers, give_up_after=give_up_after
        )

    def request_timeout(self, seconds: float) -> Self:
        """The most a worker may take over one batch before it is asked of another; an attempt
        is given up sooner as hung once it is several times the fleet's recent p95 latency old.
        Default 60."""
        return self._with_failover(request_timeout=seconds)

    def hedge_after(self, seconds: float | None) -> Self:
        """Also ask another worker once a batch is this late; the first answer wins. Default:
        learned from the fleet (1.5 x its recent p95 latency), at most a tenth of the requests
        hedged; None: never."""
        return self._with_failover(hedge_after=seconds)

    def no_worker_timeout(self, seconds: float) -> Self:
        """How long the fleet may answer nothing while it has requests (or every worker fail
        one request) before iteration raises, naming each worker and its last error: the loop
        first gets every batch already received, then the error, `seconds` after the fleet's
        last answer. Every worker failing is logged at once and every 10 s. Default 60."""
        return self._with_failover(no_worker_timeout=seconds)

    def poison_retries(self, workers: int) -> Self:
        """How many more workers are asked a batch whose loading killed the worker's process or
        ran past its deadline on one; when each fails it so too, iteration raises
        `loadax.errors.PoisonedRecords` (a `RecordError`) naming its rows and records. Default 1."""
        return self._with_failover(poison_retries=workers)

    def shared_memory(self, enabled: bool) -> Self:
        """Whether a worker on this host (a sidecar, one on loopback) writes batches straight
        into this process's memory rather than send them over its socket: found at the
        handshake, checked like any reply. Default True."""
        return self._with_failover(shared_memory=enabled)

    def affinity(self, enabled: bool) -> Self:
        """Whether each request goes, of the workers alike in load, to the one its digest
        prefers, so that loaders asking for the same batches (a sweep's jobs over one pipeline
        and plan, a job's processes that own the same rows) meet on one worker, which computes
        each batch once. Load still wins; the cost is a less even spread of a lone job's
        requests (the fleet simulator's busiest worker at 1.5-1.6x the mean, not 1.3x; with
        stragglers about 3 % of requests hedged, not 0.6 %). Default: on for a loader whose
        mesh has processes that own the same rows (a data axis replicated across processes),
        off otherwise: a sweep's jobs turn it on."""
        return self._with_failover(affinity=enabled)

    def quarantine(self, initial: float, longest: float) -> Self:
        """How long a worker that proved wrong for this loader (another identity, no such
        pipeline, a reply that fails its checks) is kept off before one request probes it again:
        `initial` seconds, doubling at each failed probe up to `longest`. Default 1 and 4."""
        return self._with_failover(quarantine_initial=initial, quarantine_max=longest)

    def subset(self, members: int) -> Self:
        """The most workers connected at once. Each loader uses an arc of the fleet (at least
        its share when a mesh's JAX processes share it, wider while requests wait, narrower
        while fewer keep up) so that connections stay bounded and every worker is used
        evenly; past workers that fail the arc reaches further, up to the whole fleet. The
        batches are the same whatever the subset. Default 64."""
        return self._with_failover(subset=members)

    def fingerprint(self, fingerprint: str) -> Self:
        """Bind to the pipeline identity whose fingerprint is (or starts with) `fingerprint`,
        whatever most targets serve: targets serving another are left out."""
        if (
            not isinstance(fingerprint, str)
            or len(fingerprint) < 8
            or fingerprint.strip("0123456789abcdef")
        ):
            raise ValueError(
                "fingerprint must be a pipeline fingerprint (lowercase hex digits, at least "
                f"the first 8), got {fingerprint!r}"
            )
        copy = self._with()
        copy._pinned = fingerprint
        return copy

    def local_members(
        self,
        count: int | Literal["auto"],
        *,
        config: str | Path | None = None,
        pipeline: Pipeline[Any, Any] | None = None,
        kind: Kind = "threads",
        same_host: SameHost = "fallback",
    ) -> Self:
        """Also make batches on this host: `count` members (a thread or a child process each,
        `kind`) running the loader's pipeline as the worker config at `config` builds it (its
        factory, from its python_path), or `pipeline`; placed by the same policy as the workers.
        They join only if it has the identity the workers agreed on (or the pinned one); they
        never choose it. While no worker answers, the loader runs from them (logged), and goes
        back to the fleet when one does. "auto" gives them this host's cores one at a time (with
        threads, to one member that splits each batch over them) while the training loop's own
        time between `next()` calls grows by no more than 5 % of its whole step, and takes one
        back when it does (in two measured windows running). With no worker on another host
        to make the batches while the loop is measured without them, it gives them every core
        from the start. The batches are the same whatever the mix.

        A worker on this host (found at the handshake, with shared memory on) keeps the cores
        it loads on (its threads, as its handshake says, while it answers): "auto" gives the
        local members the others at once (from the start, or after the baseline when workers
        elsewhere made it), and the worker is used beside them. One whose threads take every
        core shares the trainer's: its batch costs the host more CPU than a local member's
        (which needs no encoding for a socket or memory file, no copy and no checksum), so the
        members get every core, and while they hold every core this process may use, the
        worker is passed over, their fallback (used again when they hold fewer, e.g. one given
        back for a slowed loop, or none can take requests). `same_host="worker"` uses it as
        any worker: never passed over, and the members come one core a window after a
        baseline that it makes."""
        copy = self._with()
        copy._local = LocalSpec(count, pipeline, kind, config, same_host)
        return copy

    def sizing(
        self, stall_target: float = DEFAULT_STALL_TARGET, window: float = DEFAULT_WINDOW_S
    ) -> Self:
        """How `stats().workers_wanted` is computed: the remote workers that would keep the
        loop waiting under `stall_target` of its time (plus one, for a failure), from its demand
        and each member's capacity over the last `window` seconds between calls of `stats()`.
        Default 2 % over 10 s."""
        if not 0 <= stall_target < 1:
            raise ValueError(f"stall_target must be in [0, 1), got {stall_target!r}")
        if not window > 0:
            raise ValueError(f"window must be a number of seconds > 0, got {window!r}")
        copy = self._with()
        copy._demand = (stall_target, window)
        return copy

    def build(self) -> RemoteLoader:
        """Connect and handshake with every target at once; the dataset's length comes from them.

        The loader binds to the pipeline identity (fingerprint, records, stream window) that the
        most targets answer by then, or the pinned one (`fingerprint`); a tie is a ValueError
        naming both groups. A target that answers another identity, does not serve the pipeline
        or runs an incompatible loadax is left out: logged and named in `stats().left_out`.
        When no target can serve, the error names each one and what it said (see `startup`).
        When the loader is sharded over a mesh of several JAX processes, every process checks
        that all bound to the same identity (a ValueError naming each process's if not).
        A length-bucketed plan (`bucket_by_length`) stays with the client, which alone has the
        lengths: each request names its rows' records. Its lengths must be an array (a function
        would need every record here) and its batches at most `MAX_LISTED_ROWS` records.
        """
        _check_buckets(self._options)
        return RemoteLoader(
            self._targets,
            self._pipeline,
            self._options,
            self._failover,
            resolver=self._resolver,
            resolve_every=self._resolve_every,
            security=self._security,
            pinned=self._pinned,
            local=self._local,
            demand=DemandMeter(*self._demand),
        )

    def _with_failover(self, **changes: Any) -> Self:
        copy = self._with()
        copy._failover = dataclasses.replace(self._failover, **changes)
        return copy


def _check_buckets(options: LoaderOptions) -> None:
    """A ValueError unless a remote loader can send the requests of `options`' buckets."""
    if isinstance(options.buckets, LengthsOf):
        raise ValueError(
            "bucket_by_length(function) measures every record where the loader is built, and a "
            "remote loader's records are on its workers: pass an array of lengths"
        )
    largest = max([options.batch_size or 0, *(size for _, size in options.batch_size_changes)])
    if options.buckets is not None and largest > MAX_LISTED_ROWS:
        raise ValueError(
            f"a remote loader's length-bucketed requests name their records: batches of at most "
            f"{MAX_LISTED_ROWS} records, got a batch size of {largest}"
        )
