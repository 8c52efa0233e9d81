"""`RemoteDataLoader`: the local loader's builder and iterator, with batches made by workers.

The client sends plan parameters, step numbers and rows, never code. Steps are placed on the
targets by load (`loadax.client.dispatch`); the shared `BatchIterator` yields batches in step
order, so the batches and the checkpoint state are exactly the local loader's. The loader binds
to one pipeline identity at build (`loadax.client.identity`, `loadax.client.startup`) and never
uses a target that answers another.

How far ahead it loads: `prefetch` batches ready for the training loop plus an in-flight depth of
`in_flight_per_worker` requests per healthy worker (within each worker's announced
`max_in_flight_per_client`), all within `memory_budget_mb` of batches held. Requests beyond the
depth wait in the executor and go out as answers come in, on the threads that receive them.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import logging
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Self

from loadax.buffers import BufferPool
from loadax.client.dispatch import Dispatcher, FleetOptions
from loadax.client.identity import (
    LEAVES_OUT,
    Answer,
    Identity,
    ask,
    handshake_request,
    require,
)
from loadax.client.security import ClientSecurity
from loadax.client.startup import Gathering, Resolver, resolve_host
from loadax.client.targets import TargetSpec, check_spec, connect
from loadax.errors import WorkerError
from loadax.execution.executor import Executor, FuturePending, Pending
from loadax.iterators.stats import LoaderStats, StatsRecorder
from loadax.loader import DEFAULT_PREFETCH, Loader, LoaderBuilder, LoaderOptions
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.limits import DEFAULT_TIMEOUT_S
from loadax.wire.plans import batch_request

_log = logging.getLogger("loadax.client")


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

    def startup(self, timeout: float = 30.0, min_workers: int = 1) -> Self:
        """`build()` proceeds once `min_workers` targets agree on the pipeline identity (and the
        others had a second more), and fails after `timeout` seconds naming each target
        and what it said; targets not up by then join when they answer."""
        return self._with_failover(startup_timeout=timeout, min_workers=min_workers)

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
        """How long every worker may be failing or quarantined before iteration raises, naming
        each worker and its last error. Default 120."""
        return self._with_failover(no_worker_timeout=seconds)

    def poison_retries(self, workers: int) -> Self:
        """How many more workers are asked a batch whose loading killed the worker's process or
        ran past its deadline on one; when each fails it so too, iteration raises
        `loadax.errors.PoisonedRecords` (a `RecordError`) naming its rows and records. Default 1."""
        return self._with_failover(poison_retries=workers)

    def quarantine(self, initial: float, longest: float) -> Self:
        """How long a worker that proved wrong for this loader (another identity, no such
        pipeline, a reply that fails its checks) is kept off before one request probes it again:
        `initial` seconds, doubling at each failed probe up to `longest`. Default 1 and 4."""
        return self._with_failover(quarantine_initial=initial, quarantine_max=longest)

    def build(self) -> RemoteLoader:
        """Connect and handshake with every target at once; the dataset's length comes from them.

        The loader binds to the pipeline identity (fingerprint, records, stream window) that the
        most targets answer by then; a tie goes to the target listed first (the addresses a host
        name lists take its place in the list, in sorted order). A target that answers another
        identity, does not serve the pipeline or runs an incompatible loadax is left out: logged
        and named in `stats().left_out`. When no target can serve, the error names each one
        and what it said (see `startup`).
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
        failover: FleetOptions,
        *,
        resolver: Resolver = resolve_host,
        resolve_every: float = 30.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self._pipeline, self._resolver, self._security = pipeline, resolver, security
        self._names = [spec for spec in specs if isinstance(spec, str) and _host_is_name(spec)]
        self._listed: set[str] = set()  # the addresses the names have listed
        self._lock = threading.Lock()  # guards the late answers' hand-over to the dispatcher
        self._late: list[Answer] | None = []  # answers that came before the dispatcher existed
        self._stats = stats = StatsRecorder()
        self._buffers = BufferPool()  # the workers' batches are received into these
        gathering = Gathering(
            specs,
            handshake_request(pipeline, options.plan(1)),
            connect=lambda spec: connect(spec, security, self._buffers),
            expand=self._expand,
            is_name=lambda spec: isinstance(spec, str) and _host_is_name(spec),
            timeout=failover.startup_timeout,
        )
        choice = gathering.choose(pipeline, failover.min_workers, self._joined)
        self._gathering = gathering
        self._identity = choice.identity
        self._handshake_plan = options.plan(choice.identity.num_records)
        chosen = {answer.target.name for answer in choice.chosen}
        # A left-out address that a name lists is asked again at each refresh.
        self._from_names = self._listed & chosen
        self._refused = self._listed - chosen
        for answer in choice.left_out:
            answer.target.close()
            self._leave_out(answer.target.name, choice.why_left_out(answer))
        dispatcher = Dispatcher(
            [answer.target for answer in choice.chosen],
            failover,
            stats,
            [answer.limit for answer in choice.chosen],
        )
        with self._lock:
            self._dispatcher = dispatcher
            late, self._late = self._late or [], None
        for answer in late:
            self._joined(answer)
        fingerprint, budget = self._identity.fingerprint, failover.memory_budget_mb << 20

        def executor() -> Executor[Any]:
            return RemoteExecutor(dispatcher, pipeline, fingerprint, stats, budget)

        super().__init__(
            self._handshake_plan,
            options,
            executor,
            prefetch=options.prefetch or DEFAULT_PREFETCH,
            stream_window=choice.identity.stream_window or None,
            stats=stats,
        )
        self._finalizer = weakref.finalize(self, _close, gathering, dispatcher)
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
        target = connect(spec, self._security, self._buffers)
        try:
            request = handshake_request(self._pipeline, self._handshake_plan)
            answer = ask(target, request, DEFAULT_TIMEOUT_S)
            require(answer, self._identity, self._pipeline)
            self._dispatcher.add(target, answer.limit)
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

    def _expand(self, spec: TargetSpec) -> list[str] | None:
        """The addresses a spec with a host name stands for (noted as listed); None for others."""
        if not (isinstance(spec, str) and _host_is_name(spec)):
            return None
        addresses = self._resolve(spec)
        with self._lock:
            self._listed.update(addresses)
        return addresses

    def _joined(self, answer: Answer) -> None:
        """A target that answered after the build: used if it serves the loader's identity."""
        with self._lock:
            if self._late is not None:
                self._late.append(answer)
                return
            name = answer.target.name
            listed = name in self._listed
        try:
            require(answer, self._identity, self._pipeline)
            self._dispatcher.add(answer.target, answer.limit)
        except (ValueError, WorkerError) as error:
            answer.target.close()
            if name in self.targets:
                return  # a refresh added it meanwhile
            if listed:
                self._refused.add(name)
            self._leave_out(name, str(error))
            return
        if listed:
            self._from_names.add(name)
        self._stats.left_out(name, None)
        _log.info("%s answered after the build and joined", name)

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
    """Hands work items' requests to the dispatcher, at most its depth outstanding at once;
    the others wait here in step order and go out as answers come in, on the threads that
    receive those, not the training loop's."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        pipeline: str,
        fingerprint: str,
        stats: StatsRecorder,
        memory_budget: int,
    ) -> None:
        self._dispatcher, self._pipeline, self._fingerprint = dispatcher, pipeline, fingerprint
        self._stats, self._memory_budget = stats, memory_budget
        self._lock = threading.Lock()
        self._waiting: deque[tuple[Plan, Work, Future[Any]]] = deque()
        self._outstanding = 0
        self._send_scheduled = False

    def lookahead(self, prefetch: int) -> int:
        """`prefetch` plus the dispatcher's depth, within the memory budget once batches are
        known."""
        ahead = prefetch + self._dispatcher.depth()
        largest = self._stats.largest
        return min(ahead, max(self._memory_budget // largest, 1)) if largest else ahead

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        """Queue `work`: the request is made and sent on the dispatcher's thread, not the
        training loop's."""
        batch: Future[Any] = Future()
        with self._lock:
            self._waiting.append((plan, work, batch))
            schedule, self._send_scheduled = not self._send_scheduled, True
        if schedule:
            self._dispatcher.soon(self._send_waiting)
        return FuturePending(batch)

    def release(self, wait: bool) -> None:
        """The connections belong to the loader, not to one iterator."""

    def _send_waiting(self) -> None:
        depth = self._dispatcher.depth()
        while True:
            with self._lock:
                self._send_scheduled = False
                if not self._waiting or self._outstanding >= depth:
                    return
                plan, work, batch = self._waiting.popleft()
                if batch.cancelled():
                    continue
                self._outstanding += 1
            request = batch_request(self._pipeline, self._fingerprint, plan, work)
            answer = self._dispatcher.send(request)
            # By weak reference: a cycle through the two futures would keep the batch until a
            # gc run.
            batch.add_done_callback(functools.partial(_cancel_with, weakref.ref(answer)))
            answer.add_done_callback(functools.partial(self._answered, batch))

    def _answered(self, batch: Future[Any], answer: Future[Any]) -> None:
        with self._lock:
            self._outstanding -= 1
        if not answer.cancelled() and batch.set_running_or_notify_cancel():
            error = answer.exception()
            if error is None:
                batch.set_result(answer.result())
            else:
                batch.set_exception(error)
        self._send_waiting()


def _cancel_with(sent: weakref.ref[Future[Any]], batch: Future[Any]) -> None:
    answer = sent()
    if batch.cancelled() and answer is not None:
        answer.cancel()


def _close(gathering: Gathering, dispatcher: Dispatcher) -> None:
    gathering.close()
    dispatcher.close()


def _host_is_name(spec: str) -> bool:
    if "://" not in spec:
        return False
    host = spec.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False
