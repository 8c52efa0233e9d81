"""The fleet's driver (`loadax.client.driver`) wakes only when the policy can act: a request the
policy would only queue is applied with the next event, in order, and a local member's answer is
applied on the thread that made its batch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from loadax import Batcher, Pipeline, Plan, RangeDataset
from loadax.client.driver import Driver
from loadax.client.fleet_events import Answered, Submit
from loadax.client.fleet_options import FleetOptions
from loadax.client.local_members import LocalWorker, _LocalTransport
from loadax.client.member import ask, handshake_request
from loadax.client.recorded import Recorded
from loadax.plan.work import StepWork
from loadax.wire.plans import batch_request

PLAN = Plan(num_records=8, batch_size=4)


class Gate:
    """Records that wait, once `armed`, until `opened`; `read` is set at the first one read."""

    def __init__(self) -> None:
        self.armed, self.read, self.opened = threading.Event(), threading.Event(), threading.Event()

    def record(self, index: int) -> np.ndarray[Any, Any]:
        if self.armed.is_set():
            self.read.set()
            assert self.opened.wait(timeout=10)
        return np.full(2, index)


@pytest.fixture
def gate() -> Iterator[Gate]:
    made = Gate()
    yield made
    made.opened.set()


def driven(gate: Gate, recorded: list[Recorded], **options: Any) -> tuple[Driver, LocalWorker]:
    """A driver of one local member (2 threads) whose records pass `gate`."""
    worker = LocalWorker("p", Pipeline(RangeDataset(0, 8).map(gate.record), Batcher()), None)
    driver = Driver(FleetOptions(request_timeout=10.0, **options), record=recorded)
    transport = _LocalTransport(worker, threads=2, name="local 0")
    driver.join(ask(transport, handshake_request("p", PLAN), timeout=0))
    gate.armed.set()
    return driver, worker


def submit(driver: Driver, worker: LocalWorker, step: int, made_on: list[str] | None = None) -> Any:
    """Batch `step`'s future; the name of the thread its request is made on goes to `made_on`."""

    def make() -> Any:
        if made_on is not None:
            made_on.append(threading.current_thread().name)
        return batch_request("p", worker.fingerprint, PLAN, StepWork(step))

    return driver.submit(step, make)


def idle(driver: Driver) -> None:
    """Once the driver's pass running now (if any) is over."""
    with driver._passing:
        pass


def test_a_request_the_policy_would_only_queue_is_applied_with_the_answer_that_admits_it(
    gate: Gate,
) -> None:
    # It wakes nobody: the next pass applies it (here the answer's, on the thread that made the
    # batch), before what came after it.
    recorded: list[Recorded] = []
    made_on: list[str] = []
    driver, worker = driven(gate, recorded, in_flight_per_worker=1)
    try:
        batches = [submit(driver, worker, 0)]
        assert gate.read.wait(timeout=10)  # sent: the policy admits no other
        idle(driver)
        batches += [submit(driver, worker, step, made_on) for step in (1, 0)]
        gate.opened.set()
        steps = [batch.result(timeout=10)[:, 0].tolist() for batch in batches]
    finally:
        driver.close()
    assert steps == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    submitted = [(at, event) for at, event, _ in recorded if isinstance(event, Submit)]
    assert [event.step for _, event in submitted] == [0, 1, 0]  # in order
    (answered_at, _), *_ = [(at, e) for at, e, _ in recorded if isinstance(e, Answered)]
    assert [at for at, _ in submitted[1:]] == [answered_at, answered_at]
    assert [name.rsplit("_", 1)[0] for name in made_on] == ["loadax", "loadax"]  # the executor's


def test_a_local_members_batch_is_handed_over_on_the_thread_that_made_it(gate: Gate) -> None:
    # Not by the driver's thread, woken for it: one more thread to wake per batch, on the cores
    # the member's threads keep busy.
    resolved_on: list[str] = []
    driver, worker = driven(gate, [])
    try:
        batch = submit(driver, worker, 1)
        assert gate.read.wait(timeout=10)
        idle(driver)
        batch.add_done_callback(lambda _: resolved_on.append(threading.current_thread().name))
        gate.opened.set()
        assert batch.result(timeout=10)[:, 0].tolist() == [4, 5, 6, 7]
    finally:
        driver.close()
    assert [name.rsplit("_", 1)[0] for name in resolved_on] == ["loadax"]  # the executor's
