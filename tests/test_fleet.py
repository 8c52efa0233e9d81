"""Never mix: a loader binds to one pipeline identity at build, leaves out the targets that
answer another, and quarantines a worker that turns out wrong for it, with unchanged batches."""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import functools
import itertools
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future
from typing import Any

import numpy as np
import pipelines
import pytest
from equivalence import digests
from processes import free_port
from workers import WorkerProcess, pinned, worker_process

import loadax.client.member
import loadax.client.names
import loadax.client.startup
import loadax.client.verdicts
import loadax.server.throttled_log
from loadax import DataLoader, RecordError, WorkerError
from loadax.client import RemoteDataLoader
from loadax.client.driver import Driver
from loadax.client.fleet_events import Answered, Send, Tick
from loadax.client.fleet_options import FleetOptions
from loadax.client.member import Member, handshake_request
from loadax.client.policy import TICK
from loadax.client.recorded import Recorded, replay
from loadax.client.replies import ReplyDecoder
from loadax.client.transports.in_process import InProcessTransport
from loadax.client.verdicts import Verdict, verdict
from loadax.errors import RemoteCause
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork
from loadax.server.worker import Worker
from loadax.wire.failures import RecordFailed
from loadax.wire.plans import batch_request
from loadax.wire.v1 import worker_pb2 as wire

RECORDS, FLOATS, BATCH, SEED = 48, 32, 4, 7
STEPS = RECORDS // BATCH
DELAY = 0.002  # per record on the workers: the loop runs long enough to see workers restart


def blobs(floats: int = FLOATS, delay: float = DELAY) -> str:
    return f"""
[pipelines.blobs]
factory = "pipelines:blobs"
args = {{ records = {RECORDS}, floats = {floats}, delay = {delay} }}
"""


GOOD = blobs()
OTHER = blobs(floats=16)  # the same name, another identity
WITHOUT = """
[pipelines.numbers]
factory = "pipelines:numbers"
"""
CLIENT_LOG = "loadax.client"


def reference(count: int) -> list[str]:
    """The digests of the first `count` batches of the local loader, repeating forever."""
    pipeline = pipelines.blobs(records=RECORDS, floats=FLOATS)
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(0)
    return digests(itertools.islice(local.num_epochs(None).build(pipeline.dataset), count))


def builder(targets: list[Any], **failover: float) -> RemoteDataLoader:
    loader = RemoteDataLoader(targets, pipeline="blobs").batch_size(BATCH).shuffle(seed=SEED)
    for option, value in failover.items():
        loader = getattr(loader, option)(value)
    return loader.prefetch(6)


def identity_of(target: str) -> str:
    """The fingerprint `target` serves pipeline "blobs" with."""
    with builder([target]).build() as loader:
        return loader.identity.fingerprint


def quarantine_log(caplog: pytest.LogCaptureFixture, target: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == CLIENT_LOG and record.getMessage().startswith(f"quarantined {target}:")
    ]


# Run time: workers restarted wrong for the loader are quarantined; training goes on.


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_workers_restarted_with_another_identity_or_without_the_pipeline_are_quarantined(
    tmp_path: pathlib.Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pinned(tmp_path, transport) as fleet:
        good, wrong, missing = (fleet.start(GOOD) for _ in range(3))
        with builder([good, wrong, missing]).num_epochs(None).build() as loader:
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(5)]
            fleet.restart(1, OTHER)
            fleet.restart(2, WITHOUT)
            reasons: dict[str, str] = {}
            deadline = time.monotonic() + 120
            while len(reasons) < 2:
                assert time.monotonic() < deadline, f"not both quarantined: {loader.stats()}"
                seen.append(next(iterator))
                for target in (wrong, missing):
                    reason = loader.stats().workers[target].quarantined
                    if reason is not None:
                        reasons.setdefault(target, reason)
            # Training goes on with the good worker, and the bad ones are kept off.
            seen += [next(iterator) for _ in range(2 * STEPS)]
            stats = loader.stats()
            expected = loader.identity.fingerprint
        other = identity_of(wrong)
    assert digests(seen) == reference(len(seen))
    assert reasons[wrong].startswith("FAILED_PRECONDITION")
    assert expected[:12] in reasons[wrong]
    assert other[:12] in reasons[wrong]
    assert reasons[missing].startswith("NOT_FOUND: unknown pipeline 'blobs'")
    assert stats.workers[good].quarantined is None
    assert stats.workers[good].requests > stats.workers[wrong].requests
    for target in (wrong, missing):
        assert stats.workers[target].quarantined is not None
        assert len(quarantine_log(caplog, target)) == 1, caplog.text


def test_when_every_worker_serves_another_identity_iteration_fails_at_once(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ZeroMQ reconnects within 100 ms: the restarted workers answer well within the timeout.
    limit = 2.0
    with pinned(tmp_path, "zmq") as fleet:
        targets = [fleet.start(GOOD) for _ in range(2)]
        with builder(targets, no_worker_timeout=limit).build() as loader:
            assert digests(loader) == reference(STEPS)
            expected = loader.identity.fingerprint
            for index in range(2):
                fleet.restart(index, OTHER)
            started = time.monotonic()
            with pytest.raises(WorkerError) as raised:
                next(iter(loader))
            waited = time.monotonic() - started
            stats = loader.stats()
        other = identity_of(targets[0])
    assert waited < 10 * limit  # at once: no worker will ever serve this identity again
    error = raised.value
    assert error.code == "FAILED_PRECONDITION"
    assert error.message.startswith("no worker serves this loader's pipeline identity any more")
    for target in targets:
        described = error.message.split(f"{target} (", 1)[1].split(")", 1)[0]
        assert described.startswith("FAILED_PRECONDITION")
        assert described.endswith("; quarantined")
        assert expected[:12] in described
        assert other[:12] in described
        assert stats.workers[target].quarantined is not None
        assert len(quarantine_log(caplog, target)) == 1


# Build time: the identity most targets answer wins; the rest are left out and reported.


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerProcess]]:
    """Two workers serving GOOD, one serving OTHER, one without the pipeline."""
    directory = tmp_path_factory.mktemp("fleet")
    kinds = {"good0": GOOD, "good1": GOOD, "other": OTHER, "without": WITHOUT}
    with contextlib.ExitStack() as stack:
        running = {}
        for name, served in kinds.items():
            (directory / name).mkdir()
            running[name] = stack.enter_context(worker_process(directory / name, served, zmq=True))
        yield running


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_targets_with_another_identity_or_without_the_pipeline_are_left_out_at_build(
    fleet: dict[str, WorkerProcess], transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    good0, other, without, good1 = (
        getattr(fleet[name], transport) for name in ("good0", "other", "without", "good1")
    )
    with builder([other, good0, without, good1]).build() as loader:
        assert loader.targets == [good0, good1]
        batches = digests(loader)
        left_out = loader.stats().left_out
        expected = loader.identity
    assert batches == reference(STEPS)
    assert list(left_out) == [other, without]
    foreign = identity_of(other)
    assert left_out[other] == (
        f"another pipeline identity: fingerprint {foreign[:12]}, {RECORDS} records; "
        f"the loader's is {expected}"
    )
    assert left_out[without].startswith("NOT_FOUND: unknown pipeline 'blobs'")
    warnings = [record.getMessage() for record in caplog.records if record.name == CLIENT_LOG]
    for target in (other, without):
        assert f"left out {target}, which cannot serve this loader: {left_out[target]}" in warnings


def test_a_target_with_another_identity_alone_is_refused_naming_both(
    fleet: dict[str, WorkerProcess],
) -> None:
    good, other = fleet["good0"].grpc, fleet["other"].grpc
    foreign = identity_of(other)
    with builder([good]).build() as loader:
        expected = loader.identity.fingerprint
        with pytest.raises(ValueError, match="serves pipeline 'blobs' with") as refused:
            loader.add_target(other)
        assert loader.targets == [good]
    message = str(refused.value)
    assert message == (
        f"{other} serves pipeline 'blobs' with fingerprint {foreign[:12]}, {RECORDS} records, "
        f"the loader's workers with fingerprint {expected[:12]}, {RECORDS} records"
    )


def test_with_no_target_able_to_serve_the_build_fails_naming_each(
    fleet: dict[str, WorkerProcess],
) -> None:
    without = fleet["without"]
    targets = [without.grpc, without.zmq]
    with pytest.raises(WorkerError) as raised:
        builder(targets).build()
    assert raised.value.code == "NOT_FOUND"
    message = raised.value.message
    assert message.startswith("no target serves pipeline 'blobs' to this client: ")
    for target in targets:
        assert f"{target} answered NOT_FOUND: unknown pipeline 'blobs'" in message
    # A lone target's own error is the clearest.
    with pytest.raises(WorkerError, match=r"^NOT_FOUND: unknown pipeline 'blobs'"):
        builder(targets[:1]).build()


def test_a_listed_address_with_another_identity_is_left_out_at_each_refresh(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    port, listed = free_port(), ["127.0.0.1"]
    with pinned(tmp_path, "grpc") as fleet:
        good = fleet.start(GOOD, port=port)
        other = fleet.start(OTHER, host="127.0.0.2", port=port)
        name = RemoteDataLoader(
            [f"grpc://workers.test:{port}"], pipeline="blobs", resolver=lambda host: list(listed)
        )
        with name.batch_size(BATCH).shuffle(seed=SEED).build() as remote:
            iterator = iter(remote)
            seen = [next(iterator) for _ in range(3)]
            listed.append("127.0.0.2")
            for _ in range(2):
                remote.refresh()
                assert remote.targets == [good]
                assert list(remote.stats().left_out) == [other]
            seen += list(iterator)
            listed.remove("127.0.0.2")
            remote.refresh()
            assert remote.stats().left_out == {}
    assert digests(seen) == reference(STEPS)
    refusals = [
        record.getMessage()
        for record in caplog.records
        if record.getMessage().startswith(f"left out {other}, which cannot serve this loader")
    ]
    assert len(refusals) == 2  # once per refresh that found it


# The dispatcher's verdicts, with in-process workers.


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (WorkerError("UNAVAILABLE", "gone"), Verdict.RETRY),
        (WorkerError("DEADLINE_EXCEEDED", "late"), Verdict.RETRY),
        (WorkerError("RESOURCE_EXHAUSTED", "busy"), Verdict.PRESSURE),
        (WorkerError("INTERNAL", "bug"), Verdict.RETRY),
        (WorkerError("FAILED_PRECONDITION", "another identity"), Verdict.QUARANTINE),
        (WorkerError("NOT_FOUND", "no such pipeline"), Verdict.QUARANTINE),
        (WorkerError("DATA_LOSS", "a bad reply"), Verdict.QUARANTINE),
        (WorkerError("INVALID_ARGUMENT", "bad rows"), Verdict.FATAL),
        (WorkerError("OUT_OF_RANGE", "past the plan"), Verdict.FATAL),
        (WorkerError("UNAUTHENTICATED", "no token"), Verdict.FATAL),
        (RecordError(7, 0, RemoteCause("ValueError", "corrupt")), Verdict.FATAL),
        (RecordFailed(wire.RecordFailure(index=7, cause_type="ValueError")), Verdict.FATAL),
        (ValueError("a bug of the client"), Verdict.FATAL),
    ],
)
def test_each_failure_gets_its_verdict(error: BaseException, expected: Verdict) -> None:
    assert verdict(error) is expected


def test_the_examples_of_the_fleet_modules_run() -> None:
    modules = (
        loadax.client.member,
        loadax.client.names,
        loadax.client.startup,
        loadax.client.verdicts,
        loadax.server.throttled_log,
    )
    for module in modules:
        failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert tried > 0, module.__name__
        assert failed == 0, module.__name__


PLAN = Plan(num_records=16, batch_size=4)
_made: list[Worker] = []


@pytest.fixture(autouse=True)
def _close_workers() -> Iterator[None]:
    """Closes the in-process workers a test made."""
    yield
    while _made:
        _made.pop().close()


def numbers_worker(records: int = 16, name: str = "numbers") -> Worker:
    _made.append(Worker({name: pipelines.numbers(records=records)}, threads=1))
    return _made[-1]


class Corrupting:
    """A worker whose replies fail the client's checks, as a corrupt reply would (DATA_LOSS)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        return self._worker.handshake(request)

    def load_batch(self, request: wire.BatchRequest) -> Any:
        raise WorkerError(
            "DATA_LOSS", f"in-process Corrupting sent a bad reply to step {request.step}"
        )


class Restartable:
    """A worker object that can be swapped for another, as a restarted worker would be."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        result: wire.HandshakeResponse = self.worker.handshake(request)
        return result

    def load_batch(self, request: wire.BatchRequest) -> Any:
        return self.worker.load_batch(request)


def named(worker: Any, name: str) -> InProcessTransport:
    transport = InProcessTransport(worker, threads=1)
    transport.name = name
    return transport


class Fleet:
    """A driver of in-process members, asked requests directly."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def send(self, request: wire.BatchRequest) -> Future[Any]:
        return self.driver.submit(request.step, lambda: request)

    def snapshot(self, names: list[str]) -> Any:
        """The stats of the members `names`, as a loader's `stats()` gives them."""
        members = self.driver.member_stats()
        return StatsView({name: members[name] for name in names})


@dataclasses.dataclass
class StatsView:
    workers: dict[str, Any]


@contextlib.contextmanager
def dispatcher(
    targets: list[InProcessTransport], **options: float
) -> Iterator[tuple[Fleet, Fleet]]:
    failover = FleetOptions(**{"request_timeout": 30.0, "no_worker_timeout": 30.0, **options})
    driver = Driver(failover)
    for transport in targets:
        driver.join(Member(transport, ReplyDecoder(transport.name), None))
    try:
        yield Fleet(driver), Fleet(driver)
    finally:
        driver.close()


def fingerprint(worker: Worker) -> str:
    return worker.handshake(handshake_request("numbers", PLAN)).fingerprint


def request(good: Worker, step: int, rows: list[int] | None = None) -> wire.BatchRequest:
    work = StepWork(step, None if rows is None else np.array(rows))
    return batch_request("numbers", fingerprint(good), PLAN, work)


@functools.cache
def local_batch(step: int) -> Any:
    pipeline = pipelines.numbers(records=16)
    return list(DataLoader(pipeline.batcher).batch_size(4).workers(0).build(pipeline.dataset))[step]


BAD_WORKERS: dict[str, tuple[Callable[[], Any], str]] = {
    "another identity": (
        lambda: numbers_worker(records=12),
        "FAILED_PRECONDITION: pipeline 'numbers' has fingerprint",
    ),
    "no such pipeline": (
        lambda: numbers_worker(name="letters"),
        "NOT_FOUND: unknown pipeline 'numbers'",
    ),
    "a bad reply": (
        lambda: Corrupting(numbers_worker()),
        "DATA_LOSS: in-process Corrupting sent a bad reply to step 0",
    ),
}


@pytest.mark.parametrize("kind", list(BAD_WORKERS))
def test_a_wrong_worker_is_quarantined_and_its_request_reissued_at_once(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, reason = BAD_WORKERS[kind]
    good = numbers_worker()
    targets = [named(make(), "bad"), named(good, "good")]
    # A quarantine far longer than the test, a transient back-off far shorter: the bad worker
    # gets one request only, however many follow and however long they take.
    options = {"quarantine_initial": 3600, "quarantine_max": 3600, "backoff_max": 0.001}
    with dispatcher(targets, **options) as (running, stats):
        sent, started = 0, time.monotonic()
        while sent < 4 or time.monotonic() - started < 0.2:  # step 0 goes to "bad" first
            step = sent % 4
            batch = running.send(request(good, step)).result(timeout=10)
            assert np.array_equal(batch["x"], local_batch(step)["x"])
            sent += 1
        numbers = stats.snapshot(["bad", "good"]).workers
    assert (numbers["bad"].requests, numbers["bad"].failures) == (1, 1)
    assert numbers["bad"].quarantined is not None
    assert numbers["bad"].quarantined.startswith(reason)
    assert numbers["bad"].last_error == numbers["bad"].quarantined
    assert (numbers["good"].requests, numbers["good"].quarantined) == (sent, None)
    assert quarantine_log(caplog, "bad") == [
        f"quarantined bad: it is tried again after 3600 s, up to every 3600 s until it answers; "
        f"its requests go to the other workers. It answered: {numbers['bad'].quarantined}"
    ]


def test_a_quarantined_worker_is_logged_once_and_rejoins_once_it_answers_right(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, CLIENT_LOG)
    good = numbers_worker()
    restarted = Restartable(numbers_worker(records=12))
    targets = [named(restarted, "restarted"), named(good, "good")]
    quick = {"quarantine_initial": 0.01, "quarantine_max": 0.02}

    def state() -> tuple[int, str | None]:
        numbers = stats.snapshot(["restarted"]).workers["restarted"]
        return numbers.failures, numbers.quarantined

    with dispatcher(targets, **quick) as (running, stats):
        deadline = time.monotonic() + 60
        for step in itertools.cycle(range(4)):  # probed again and again while it is wrong
            running.send(request(good, step)).result(timeout=10)
            if state()[0] >= 3:
                break
            assert time.monotonic() < deadline, state()
        assert state()[1] is not None
        restarted.worker = numbers_worker()  # restarted with the loader's identity
        for step in itertools.cycle(range(4)):
            batch = running.send(request(good, step)).result(timeout=10)
            assert np.array_equal(batch["x"], local_batch(step)["x"])
            if state()[1] is None:
                break
            assert time.monotonic() < deadline, state()
        served = stats.snapshot(["restarted"]).workers["restarted"].latency_max
    assert served is not None  # it answered
    assert len(quarantine_log(caplog, "restarted")) == 1
    assert "restarted answered again: out of quarantine" in caplog.messages


@pytest.mark.parametrize(
    ("rows", "step", "code"), [(None, 99, "OUT_OF_RANGE"), ([0, 9], 1, "INVALID_ARGUMENT")]
)
def test_a_wrong_request_fails_at_once_and_quarantines_no_worker(
    rows: list[int] | None, step: int, code: str
) -> None:
    good = numbers_worker()
    targets = [named(good, "first"), named(numbers_worker(), "second")]
    with dispatcher(targets) as (running, stats):
        with pytest.raises(WorkerError) as raised:
            running.send(request(good, step, rows)).result(timeout=10)
        numbers = stats.snapshot(["first", "second"]).workers
    assert raised.value.code == code
    assert sum(worker.requests for worker in numbers.values()) == 1  # asked of no other worker
    assert all(worker.quarantined is None for worker in numbers.values())


def test_a_record_that_fails_is_raised_at_once_and_quarantines_no_worker() -> None:
    class Other(Worker):  # in-process targets are named by their class
        pass

    # The failing record is in the last batch: no request is left in flight when the workers
    # close (an in-process worker closed under a request never answers it).
    failing = [
        Worker({"failing": pipelines.failing(records=8, bad=7)}, threads=1),
        Other({"failing": pipelines.failing(records=8, bad=7)}, threads=1),
    ]
    try:
        with RemoteDataLoader(failing, "failing").batch_size(4).build() as loader:
            with pytest.raises(RecordError) as raised:
                list(loader)
            numbers = loader.stats().workers
    finally:
        for worker in failing:
            worker.close()
    assert (raised.value.index, raised.value.epoch) == (7, 0)
    assert all(worker.quarantined is None for worker in numbers.values())
    assert all(worker.failures == 0 for worker in numbers.values())


def test_with_every_worker_quarantined_a_request_fails_naming_each() -> None:
    good = numbers_worker()
    targets = [named(numbers_worker(records=12), "wrong"), named(Corrupting(good), "corrupt")]
    with dispatcher(targets, no_worker_timeout=0.5) as (running, _):
        attempt: Future[Any] = running.send(request(good, 0))
        with pytest.raises(WorkerError) as raised:
            attempt.result(timeout=30)
    message = raised.value.message
    assert message.startswith("no worker answered for 0.5 s (no_worker_timeout), from step 0 on")
    assert "wrong (FAILED_PRECONDITION: pipeline 'numbers' has fingerprint" in message
    assert "corrupt (DATA_LOSS: in-process Corrupting sent a bad reply" in message
    assert message.count("; quarantined)") == 2


def test_a_worker_with_an_incompatible_version_is_left_out_at_build(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Old:
        def __init__(self, worker: Worker) -> None:
            self._worker = worker

        def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
            answer = self._worker.handshake(request)
            answer.library_version = "0.0.1"
            return answer

        def load_batch(self, request: wire.BatchRequest) -> Any:
            return self._worker.load_batch(request)

    good = numbers_worker()
    with RemoteDataLoader([Old(numbers_worker()), good], "numbers").batch_size(4).build() as loader:
        assert loader.targets == ["in-process Worker"]
        batches = [batch["x"].tolist() for batch in loader]
        left_out = loader.stats().left_out
    assert batches == [local_batch(step)["x"].tolist() for step in range(4)]
    assert left_out == {
        "in-process Old": (
            f"FAILED_PRECONDITION: in-process Old runs loadax 0.0.1, this client "
            f"{loadax.__version__}: major and minor versions must match"
        )
    }
    assert any(message.startswith("left out in-process Old") for message in caplog.messages)


def test_a_target_that_raises_when_asked_fails_its_attempt_not_the_dispatcher() -> None:
    # A target closed as it is chosen (e.g. removed by another thread) raises in load_batch.
    good = numbers_worker()
    closed = named(numbers_worker(), "closed")
    closed.close()
    with dispatcher([closed, named(good, "good")], backoff_max=0.001) as (running, stats):
        for step in range(8):
            batch = running.send(request(good, step % 4)).result(timeout=10)
            assert np.array_equal(batch["x"], local_batch(step % 4)["x"])
        numbers = stats.snapshot(["closed", "good"]).workers
    assert numbers["closed"].failures >= 1
    assert numbers["closed"].last_error is not None
    assert "could not be asked" in numbers["closed"].last_error


def test_a_driven_run_is_recorded_and_replays_to_the_same_decisions() -> None:
    good = numbers_worker()
    recorded: list[Recorded] = []
    options = FleetOptions(request_timeout=30.0, no_worker_timeout=30.0)
    driver = Driver(options, record=recorded)
    for name in ("first", "second"):
        transport = named(numbers_worker(), name)
        driver.join(Member(transport, ReplyDecoder(name), None))
    try:
        batches = [
            driver.submit(step, functools.partial(request, good, step % 4)) for step in range(8)
        ]
        for step, batch in enumerate(batches):
            assert np.array_equal(batch.result(timeout=10)["x"], local_batch(step % 4)["x"])
    finally:
        driver.close()
    sends = [action for _, _, actions in recorded for action in actions if isinstance(action, Send)]
    assert len(sends) >= 8
    replayed = replay(options, recorded)
    assert [repr(actions) for actions in replayed] == [repr(actions) for _, _, actions in recorded]


class Stuck:
    """A worker that answers no batch until `released` is set (then an error)."""

    def __init__(self, worker: Worker) -> None:
        self._worker, self.released = worker, threading.Event()

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        return self._worker.handshake(request)

    def load_batch(self, request: wire.BatchRequest) -> Any:
        self.released.wait()
        raise WorkerError("UNAVAILABLE", "released")


def test_the_driver_ticks_at_the_policys_deadlines_not_at_each_event_nor_at_a_pace() -> None:
    # Answers stream in from one member while another holds its attempt: the hang check comes at
    # its deadline (request_timeout after the attempt was sent), with hardly a tick before it.
    good, stuck = numbers_worker(), Stuck(numbers_worker())
    recorded: list[Recorded] = []
    hung = 0.3
    options = FleetOptions(request_timeout=hung, no_worker_timeout=30.0, hedge_after=30.0)
    driver = Driver(options, record=recorded)
    for worker, name in ((good, "good"), (stuck, "stuck")):
        driver.join(Member(named(worker, name), ReplyDecoder(name), None))
    pending: list[Future[Any]] = []
    steps = itertools.count()
    try:
        started = time.monotonic()
        while time.monotonic() - started < hung + 0.2:
            pending = [batch for batch in pending if not batch.done()]
            while len(pending) < 4:
                step = next(steps)
                pending.append(driver.submit(step, functools.partial(request, good, step % 4)))
            futures.wait(pending, timeout=0.01, return_when=futures.FIRST_COMPLETED)
    finally:
        stuck.released.set()
        driver.close()
    sends = [(at, action) for at, _, actions in recorded for action in actions]
    sent_at, first = next((at, a) for at, a in sends if isinstance(a, Send) and a.member == "stuck")
    again_at = next(
        at
        for at, event, actions in recorded
        if isinstance(event, Tick)
        for action in actions
        if isinstance(action, Send) and action.request == first.request
    )
    assert sent_at + hung <= again_at <= sent_at + hung + 0.2  # a loaded machine's delay
    answers = sum(
        sent_at < at < again_at for at, event, _ in recorded if isinstance(event, Answered)
    )
    ticks = sum(sent_at < at < again_at for at, event, _ in recorded if isinstance(event, Tick))
    assert answers > hung / TICK  # events came more often than the old pace of ticks
    assert ticks <= 2, (ticks, answers)
