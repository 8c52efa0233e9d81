"""`RemoteDataLoader`: the local loader's builder and iterator, with batches made by workers.

The client sends plan parameters, step numbers and rows, never code. Steps are spread over the
targets; the shared `BatchIterator` keeps `prefetch` requests in flight and yields batches in
step order, so the batches and the checkpoint state are exactly the local loader's. The loader
binds to one pipeline identity at build (`loadax.client.identity`) and never uses a target that
answers another.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Self

from loadax.client.dispatch import Dispatcher, FailoverOptions
from loadax.client.identity import LEAVES_OUT, Identity, ask, choose, handshake_request, require
from loadax.client.security import ClientSecurity
from loadax.client.stats import LoaderStats, StatsRecorder
from loadax.client.targets import Target, TargetSpec, connect
from loadax.errors import WorkerError
from loadax.execution.executor import Executor, Pending
from loadax.loader import DEFAULT_PREFETCH, Loader, LoaderBuilder, LoaderOptions
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.plans import batch_request

_log = logging.getLogger("loadax.client")

Resolver = Callable[[str], list[str]]
"""A host name -> the IP addresses it lists."""


def resolve_host(host: str) -> list[str]:
    """Every address DNS (or /etc/hosts) lists for `host`, sorted."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


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
        if not isinstance(pipeline, str) or not pipeline:
            raise ValueError(f"pipeline must be a pipeline name, got {pipeline!r}")
        self._targets, self._pipeline = list(targets), pipeline
        self._resolver, self._resolve_every = resolver, resolve_every
        self._security = security
        self._failover = FailoverOptions()

    def prefetch(self, batches: int) -> Self:
        """Requests in flight ahead of the training loop. Default 2."""
        return self._with(prefetch=batches)

    def request_timeout(self, seconds: float) -> Self:
        """How long a worker may take over one batch before it is asked of another. Default 60."""
        return self._with_failover(request_timeout=seconds)

    def hedge_after(self, seconds: float | None) -> Self:
        """Also ask another worker once a batch is this late; the first answer wins. Default off."""
        return self._with_failover(hedge_after=seconds)

    def no_worker_timeout(self, seconds: float) -> Self:
        """How long every worker may be failing or quarantined before iteration raises, naming
        each worker and its last error. Default 120."""
        return self._with_failover(no_worker_timeout=seconds)

    def quarantine(self, initial: float, longest: float) -> Self:
        """How long a worker that proved wrong for this loader (another identity, no such
        pipeline, a reply that fails its checks) is kept off before one request probes it again:
        `initial` seconds, doubling at each failed probe up to `longest`. Default 1 and 4."""
        return self._with_failover(quarantine_initial=initial, quarantine_max=longest)

    def build(self) -> RemoteLoader:
        """Connect and handshake with every target; the dataset's length comes from them.

        The loader binds to the pipeline identity (fingerprint, records, stream window) that the
        most targets answer; a tie goes to the target listed first (the addresses a host name
        lists take its place in the list, in sorted order). A target that answers another
        identity, does not serve the pipeline or runs an incompatible loadax is left out: logged
        and named in `stats().left_out`. When no target can serve, the error names each one
        and its answer.
        """
        return RemoteLoader(
            self._targets,
            self._pipeline,
            self._options,
            self._failover,
            resolver=self._resolver,
            resolve_every=self._resolve_every,
            security=self._security,
        )

    def _with_failover(self, **changes: Any) -> Self:
        copy = self._with()
        copy._failover = dataclasses.replace(self._failover, **changes)
        return copy


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
        failover: FailoverOptions,
        *,
        resolver: Resolver = resolve_host,
        resolve_every: float = 30.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self._pipeline, self._resolver, self._security = pipeline, resolver, security
        self._names = [spec for spec in specs if isinstance(spec, str) and _host_is_name(spec)]
        # A name stands, in the list's order, for every address it lists.
        ordered: list[TargetSpec] = []
        from_names: set[str] = set()
        for spec in specs:
            if isinstance(spec, str) and _host_is_name(spec):
                listed = [address for address in self._resolve(spec) if address not in ordered]
                ordered += sorted(listed)
                from_names.update(listed)
            else:
                ordered.append(spec)
        targets = _connect_all(ordered, security)
        try:
            request = handshake_request(pipeline, options.plan(1))
            choice = choose([ask(target, request) for target in targets], pipeline)
        except BaseException:
            _close_all(targets)
            raise
        self._identity = choice.identity
        self._handshake_plan = options.plan(choice.identity.num_records)
        self._stats = stats = StatsRecorder()
        # A left-out address that a name lists is asked again at each refresh.
        self._from_names = from_names & {target.name for target in choice.chosen}
        self._refused = from_names - self._from_names
        for answer in choice.left_out:
            answer.target.close()
            self._leave_out(answer.target.name, choice.why_left_out(answer))
        self._dispatcher = Dispatcher(choice.chosen, failover, stats)
        dispatcher, fingerprint = self._dispatcher, self._identity.fingerprint

        def executor() -> Executor[Any]:
            return RemoteExecutor(dispatcher, pipeline, fingerprint, stats)

        super().__init__(
            self._handshake_plan,
            options,
            executor,
            prefetch=options.prefetch or DEFAULT_PREFETCH,
            stream_window=choice.identity.stream_window or None,
        )
        self._finalizer = weakref.finalize(self, dispatcher.close)
        if self._names:
            self._schedule_refresh(resolve_every)

    @property
    def targets(self) -> list[str]:
        """The names of the targets in use."""
        return self._dispatcher.targets

    @property
    def identity(self) -> Identity:
        """The pipeline identity the loader is bound to: no other's batch is ever used."""
        return self._identity

    def stats(self) -> LoaderStats:
        """Batches, bytes and rates since the first request, the share of that time the
        training loop waited for data, each worker in use's requests, failures, latency and
        quarantine, and the targets left out for what they answered."""
        return self._stats.snapshot(self.targets)

    def add_target(self, spec: TargetSpec) -> None:
        """Start using another worker, after checking it serves the loader's pipeline identity:
        a ValueError naming both identities if not, the worker's error if it cannot serve."""
        (target,) = _connect_all([spec], self._security)
        try:
            request = handshake_request(self._pipeline, self._handshake_plan)
            require(ask(target, request), self._identity, self._pipeline)
            self._dispatcher.add(target)
        except BaseException:
            target.close()
            raise
        self._stats.left_out(target.name, None)

    def remove_target(self, name: str) -> None:
        """Stop using a worker; the requests it held are sent to the others."""
        self._dispatcher.remove(name)

    def refresh(self) -> None:
        """Look the target names up again; add the addresses that appeared, drop those gone."""
        listed = {target for name in self._names for target in self._resolve(name)}
        for name in sorted(self._from_names - listed):
            self._from_names.discard(name)
            if name in self.targets:
                self.remove_target(name)
        for name in sorted(self._refused - listed):
            self._refused.discard(name)
            self._stats.left_out(name, None)
        for name in sorted(listed - self._from_names):
            if name not in self.targets:
                try:
                    self.add_target(name)
                except (ValueError, WorkerError) as error:
                    if isinstance(error, WorkerError) and error.code not in LEAVES_OUT:
                        raise
                    self._refused.add(name)  # asked again at the next refresh
                    self._leave_out(name, str(error))
                    continue
            self._refused.discard(name)
            self._from_names.add(name)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _leave_out(self, target: str, why: str) -> None:
        _log.warning("left out %s, which cannot serve this loader: %s", target, why)
        self._stats.left_out(target, why)

    def _resolve(self, spec: str) -> list[str]:
        """The targets a spec with a host name stands for: one per address it lists."""
        scheme, rest = spec.split("://", 1)
        host, port = rest.rsplit(":", 1)
        return [
            f"{scheme}://[{address}]:{port}" if ":" in address else f"{scheme}://{address}:{port}"
            for address in self._resolver(host)
        ]

    def _schedule_refresh(self, every: float) -> None:
        reference = weakref.ref(self)

        def refresh_in_background() -> None:
            loader = reference()
            if loader is None or not loader._finalizer.alive:
                return
            # Handshakes block: keep them off the dispatcher's timer thread.
            threading.Thread(target=loader._refresh_logged, daemon=True).start()
            loader._dispatcher._scheduler.at(every, refresh_in_background)

        self._dispatcher._scheduler.at(every, refresh_in_background)

    def _refresh_logged(self) -> None:
        try:
            self.refresh()
        except Exception as error:  # a failed lookup must not stop training: retried next time
            _log.warning("re-resolving %s failed: %s", self._names, error)


class RemoteExecutor(Executor[Any]):
    """Hands each work item's request to the dispatcher, which sees it through to one answer."""

    def __init__(
        self, dispatcher: Dispatcher, pipeline: str, fingerprint: str, stats: StatsRecorder
    ) -> None:
        self._dispatcher, self._pipeline, self._fingerprint = dispatcher, pipeline, fingerprint
        self._stats = stats

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        request = batch_request(self._pipeline, self._fingerprint, plan, work)
        return self._stats.timed(self._dispatcher.send(request), window=work.streams)

    def release(self, wait: bool) -> None:
        """The connections belong to the loader, not to one iterator."""


def _host_is_name(spec: str) -> bool:
    if "://" not in spec:
        return False
    host = spec.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def _connect_all(specs: Sequence[TargetSpec], security: ClientSecurity | None) -> list[Target]:
    targets: list[Target] = []
    try:
        for spec in specs:
            targets.append(connect(spec, security))
    except BaseException:
        _close_all(targets)
        raise
    return targets


def _close_all(targets: Sequence[Target]) -> None:
    for target in targets:
        target.close()
