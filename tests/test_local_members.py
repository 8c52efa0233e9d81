"""Local members (`RemoteDataLoader.local_members`): the trainer's own cores as members of the
fleet. The batches are the local loader's in every mix, a member of another identity is refused,
and the loader runs from its local members while no worker answers, then returns to the fleet."""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import local_member_pipelines
import numpy as np
import pytest
from equivalence import forms, through_codec
from workers import pinned

from loadax import Batcher, DataLoader, Pipeline, Plan, RangeDataset
from loadax.client import RemoteDataLoader, remote_loader
from loadax.client.local_members import LocalSpec, LocalWorker, _LocalTransport
from loadax.client.replies import ReplyDecoder
from loadax.client.spare_cores import LoopTuner
from loadax.factories import ConfigError
from loadax.plan.work import StepWork
from loadax.server.worker import Worker
from loadax.wire.plans import batch_request

RECORDS, BATCH, SEED = 48, 4, 3
FLEET_DOWN_RECORDS = 20000


def served(records: int) -> str:
    """The `[pipelines]` table of a worker serving the loader's pipeline."""
    return f"""
[pipelines.noisy]
factory = "local_member_pipelines:noisy_records"
args = {{ records = {records} }}
"""


def worker_config(folder: Path, records: int) -> Path:
    """A worker config serving `served(records)`, as the workers' own would be."""
    path = folder / "worker.toml"
    path.write_text(f'[server]\ngrpc = "127.0.0.1:0"\n{served(records)}')
    return path


def local_batches(records: int = RECORDS) -> Iterator[Any]:
    pipeline = local_member_pipelines.noisy_records(records)
    loader = (
        DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).build(pipeline.dataset)
    )
    return iter(loader)


def builder(targets: list[Any]) -> RemoteDataLoader:
    return (
        RemoteDataLoader(targets, pipeline="noisy")
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .request_timeout(10)
    )


@pytest.fixture(scope="module")
def reference() -> list[str]:
    """The local loader's batches in the form a worker's replies decode to."""
    return forms(through_codec(local_batches()))


def verified(request: Any, reply: Any) -> Any:
    """The batch of a member's `reply` to `request`, as the driver takes it."""
    reply.result(timeout=10)
    return ReplyDecoder("local 0").verify(request, reply)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_workers_and_local_members_give_the_local_batches(kind: Any, reference: list[str]) -> None:
    worker = Worker({"noisy": local_member_pipelines.noisy_records(RECORDS)}, threads=1)
    pipeline = local_member_pipelines.noisy_records(RECORDS)
    with builder([worker]).local_members(2, pipeline=pipeline, kind=kind).build() as loader:
        assert loader.targets == ["in-process Worker", "local 0", "local 1"]
        assert forms(loader) == reference
        served = loader.stats().workers
        assert served["local 0"].requests + served["local 1"].requests > 0
        assert sum(member.requests for member in served.values()) >= len(reference)
    worker.close()


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_local_members_alone_give_the_local_batches_while_no_worker_answers(
    kind: Any,
    reference: list[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nobody = "grpc://127.0.0.1:9"  # the discard port: refused
    if kind == "threads":
        # "auto": with no worker to make the batches while the loop is measured without
        # members, they get every core from the start (none would make the baseline's).
        monkeypatch.setattr(remote_loader, "spare_cores", lambda: 2)  # whatever this host has
        pipeline = local_member_pipelines.noisy_records(RECORDS)
        local = builder([nobody]).local_members("auto", pipeline=pipeline, kind=kind)
        members = ["local 0"]  # one, splitting each batch over its 2 threads
    else:  # the worker config's factory, rebuilt in each child process
        config = worker_config(tmp_path, RECORDS)
        local = builder([nobody]).local_members(2, config=config, kind=kind)
        members = ["local 0", "local 1"]
    with caplog.at_level(logging.WARNING, logger="loadax.client"):
        loader = local.startup(timeout=5, give_up_after=0.2).build()
    with loader:
        assert loader.targets == members
        assert forms(loader) == reference
    assert any("running from local members" in r.getMessage() for r in caplog.records)


def test_a_local_members_threads_go_on_to_the_next_batch_while_one_finishes() -> None:
    # Batch 0's last record is read only once a record of batch 1 has been: the member's 2
    # threads must take the next request's records while one thread still reads batch 0's (no
    # barrier between batches, as in the local loader). One batch at a time would fail it.
    armed, next_read = threading.Event(), threading.Event()

    def record(index: int) -> np.ndarray[Any, Any]:
        if armed.is_set() and index == 3 and not next_read.wait(timeout=10):
            raise AssertionError("batch 1 was not started while batch 0 finished")
        if armed.is_set() and index >= 4:
            next_read.set()
        return np.full(2, index)

    pipeline = Pipeline(RangeDataset(0, 8).map(record), Batcher())
    worker = LocalWorker("p", pipeline, None)
    transport = _LocalTransport(worker, threads=2, name="local 0")
    plan = Plan(num_records=8, batch_size=4)
    armed.set()
    try:
        requests = [batch_request("p", worker.fingerprint, plan, StepWork(step)) for step in (0, 1)]
        replies = [transport.send(request) for request in requests]
        batches = list(map(verified, requests, replies))
    finally:
        transport.close()
        transport.release()
    assert [batch[:, 0].tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_thread_members_batch_is_started_on_the_senders_thread() -> None:
    # Queueing a batch's chunks is quick; a thread of its own to start them would be one more
    # thread woken per batch, on the cores the member's threads keep busy.
    started_on: list[threading.Thread] = []

    class Recorded(LocalWorker):
        def start(self, executor: Any, request: Any) -> Any:
            started_on.append(threading.current_thread())
            return super().start(executor, request)

    worker = Recorded("p", Pipeline(RangeDataset(0, 8), Batcher()), None)
    transport = _LocalTransport(worker, threads=2, name="local 0")
    plan = Plan(num_records=8, batch_size=4)
    try:
        request = batch_request("p", worker.fingerprint, plan, StepWork(1))
        reply = transport.send(request)
        assert started_on == [threading.current_thread()]
        assert verified(request, reply).tolist() == [4, 5, 6, 7]
    finally:
        transport.close()
        transport.release()


def test_a_members_batch_is_answered_on_the_thread_that_made_it_then_let_go() -> None:
    # No thread waits for a batch to answer it (one more thread to wake per batch, on the cores
    # the member's threads keep busy), and the hook that answers it is let go once called: a
    # cycle through it would keep the batch (and the pooled buffers of its leaves) until the
    # garbage collector ran.
    answered_on: list[str] = []
    made: list[weakref.ref[np.ndarray[Any, Any]]] = []
    armed, sent = threading.Event(), threading.Event()  # armed: after the identity's probe

    def record(index: int) -> np.ndarray[Any, Any]:
        if armed.is_set():  # made once the request is sent and its hook is set
            assert sent.wait(timeout=10)
        return np.full(2, index)

    def collate(records: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        batch = np.stack(records)  # the last one made is the request's (the first: the probe's)
        made.append(weakref.ref(batch))
        return batch

    class Recorded(LocalWorker):
        def answer(self, request: Any, making: Any, slots: int) -> Any:
            answered_on.append(threading.current_thread().name)
            return super().answer(request, making, slots)

    worker = Recorded("p", Pipeline(RangeDataset(0, 8).map(record), Batcher(collate)), None)
    transport = _LocalTransport(worker, threads=2, name="local 0")
    plan = Plan(num_records=8, batch_size=4)
    armed.set()
    gc.disable()
    try:
        try:
            request = batch_request("p", worker.fingerprint, plan, StepWork(1))
            reply = transport.send(request)
            sent.set()
            batch = verified(request, reply)
            assert batch[:, 0].tolist() == [4, 5, 6, 7]
            assert made[-1]() is batch  # handed over as it was made
            del reply, batch
        finally:
            transport.close()
            transport.release()  # its threads are done: none of their frames holds the batch
        assert [name.rsplit("_", 1)[0] for name in answered_on] == ["loadax"]  # the executor's
        assert made[-1]() is None, "the batch outlived its reply"
    finally:
        gc.enable()


def test_a_worker_alone_gives_the_local_batches(reference: list[str]) -> None:
    worker = Worker({"noisy": local_member_pipelines.noisy_records(RECORDS)}, threads=1)
    with builder([worker]).build() as loader:
        assert forms(loader) == reference
    worker.close()


def test_local_members_of_another_identity_are_refused_and_never_outvote_a_worker() -> None:
    worker = Worker({"noisy": local_member_pipelines.noisy_records(RECORDS)}, threads=1)
    other = local_member_pipelines.noisy_records(RECORDS + 4)
    with pytest.raises(ValueError, match="local members cannot join: local 0 serves") as caught:
        builder([worker]).local_members(2, pipeline=other).build()
    assert f"{RECORDS + 4} records" in str(caught.value)
    assert f"{RECORDS} records" in str(caught.value)
    # Nor when the fleet is down: a pinned identity is not theirs.
    pinned_other = builder(["grpc://127.0.0.1:9"]).fingerprint("0" * 64)
    with pytest.raises(ValueError, match=r"local members' fingerprint .* is not the pinned"):
        pinned_other.local_members(1, pipeline=other).startup(1, give_up_after=0.2).build()
    worker.close()


def test_bad_local_member_settings_are_named() -> None:
    pipeline = local_member_pipelines.noisy_records(RECORDS)
    with pytest.raises(ValueError, match="count must be an int >= 0 or 'auto', got -1"):
        LocalSpec(-1, pipeline)
    with pytest.raises(ValueError, match="kind must be 'threads' or 'processes', got 'gpus'"):
        LocalSpec(1, pipeline, "gpus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must be a loadax\.Pipeline, got str"):
        LocalSpec(1, "noisy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a pipeline .* or the worker config .* not both"):
        LocalSpec(1, pipeline, config="worker.toml")
    with pytest.raises(ValueError, match=r"a pipeline .* or the worker config .* not both"):
        LocalSpec(1)
    with pytest.raises(ValueError, match="same_host must be 'fallback' or 'worker', got 'no'"):
        LocalSpec(1, pipeline, same_host="no")  # type: ignore[arg-type]


def test_a_config_without_the_loaders_pipeline_is_named(tmp_path: Path) -> None:
    config = worker_config(tmp_path, RECORDS)
    worker = Worker({"images": local_member_pipelines.noisy_records(RECORDS)}, threads=1)
    local = RemoteDataLoader([worker], pipeline="images").batch_size(BATCH)
    with pytest.raises(ConfigError, match=r"no \[pipelines\.images\] table.*\['noisy'\]"):
        local.local_members(1, config=config).build()
    worker.close()


def test_the_loader_runs_from_local_members_while_the_fleet_is_down_and_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = FLEET_DOWN_RECORDS
    with pinned(tmp_path, "grpc") as fleet, caplog.at_level(logging.INFO, logger="loadax.client"):
        target = fleet.start(served(records))
        config = worker_config(tmp_path, records)  # the loader's pipeline, built here
        # The worker is on this host: used as any worker, not as the member's fallback.
        local = builder([target]).local_members(1, config=config, same_host="worker")
        with local.build() as loader:
            expected = local_batches(records)
            batches = iter(loader)

            def train_until(event: str) -> int:
                """Steps (1 ms of 'training' each) until `event` is logged."""
                for step in itertools.count(1):
                    assert forms([next(batches)]) == forms(through_codec([next(expected)]))
                    if any(getattr(r, "event", None) == event for r in caplog.records):
                        return step
                    time.sleep(0.001)
                raise AssertionError("unreachable")

            for _ in range(20):
                assert forms([next(batches)]) == forms(through_codec([next(expected)]))
            fleet.running[0].process.kill()
            train_until("fleet_down")
            answered = loader.stats().workers[target].requests
            fleet.restart(0, served(records))
            train_until("fleet_back")
            for _ in range(20):
                assert forms([next(batches)]) == forms(through_codec([next(expected)]))
            assert loader.stats().workers[target].requests > answered


def test_auto_gives_its_cores_to_one_member_once_the_loop_is_measured(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_loader, "spare_cores", lambda: 2)  # whatever this host has
    # The loop's clock ticks 20 ms at each reading (its own step 20 ms, its wait 20 ms), so that
    # what "auto" decides does not depend on this machine's load: a baseline of 4, a core, a
    # window of 8, another core (`tests/test_spare_cores.py` has the rule's cases).
    ticks = itertools.count(0.0, 0.02)
    monkeypatch.setattr(
        remote_loader, "LoopTuner", functools.partial(LoopTuner, clock=lambda: next(ticks))
    )
    records, cost_ms = 80, 1.0  # 20 batches of 4 records
    worker = Worker({"noisy": local_member_pipelines.sleepy(records, cost_ms)}, threads=1)
    pipeline = local_member_pipelines.sleepy(records, cost_ms)
    auto = builder([worker]).local_members("auto", pipeline=pipeline)
    with caplog.at_level(logging.INFO, logger="loadax.client"), auto.build() as loader:
        assert loader.targets == ["in-process Worker"]  # none before the loop is measured
        got = list(loader)
        # The cores go to one member, which splits each batch over them as a worker does.
        assert loader.targets == ["in-process Worker", "local 0"]
        assert loader.stats().workers["local 0"].requests > 0
    worker.close()
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(8)
    assert forms(got) == forms(through_codec(local.build(pipeline.dataset)))
    chosen = [r.getMessage() for r in caplog.records if r.getMessage().startswith("local members")]
    assert [message.split(" (")[0] for message in chosen] == [
        "local members' cores: 1",
        "local members' cores: 2",
    ], chosen
