"""The demand signal (`loadax.client.demand`): `workers_wanted` and `input_stall_fraction` of a
remote loader over sleep-bound workers whose rate is known, with a training loop of known pace."""

from __future__ import annotations

import math
import time

import local_member_pipelines
import pytest

from loadax.client import RemoteDataLoader
from loadax.client.demand import workers_wanted
from loadax.server.worker import Worker

RECORD_MS, BATCH, STEP_S, STEPS = 10.0, 2, 0.008, 80
# A worker with one thread makes a batch in BATCH x RECORD_MS: 50 batches/s. The loop takes one
# every STEP_S when never kept waiting: 125/s. Keeping its stall under 2 % takes the smallest n
# with n x 50 >= 0.98 x 125, i.e. 3 workers, and one more for a failure.
WORKER_RATE = 1000 / (BATCH * RECORD_MS)
TRUTH = math.ceil(0.98 / STEP_S / WORKER_RATE) + 1


@pytest.mark.parametrize("count", [1, 3])
def test_workers_wanted_is_within_one_of_the_truth(count: int) -> None:
    # Worker objects are named after their class: one class each, so that each is a member.
    workers = [
        type(f"Worker{index}", (Worker,), {})(
            {"slow": local_member_pipelines.sleepy(cost_ms=RECORD_MS)}, threads=1
        )
        for index in range(count)
    ]
    builder = RemoteDataLoader(workers, pipeline="slow").batch_size(BATCH).request_timeout(10)
    with builder.build() as loader, iter(loader) as batches:
        next(batches)  # the start-up aside
        for _ in range(STEPS):
            time.sleep(STEP_S)  # the training step
            next(batches)
        stats = loader.stats()
        assert len(loader.targets) == count
    for worker in workers:
        worker.close()
    assert TRUTH == 4
    assert stats.workers_wanted is not None
    assert abs(stats.workers_wanted - TRUTH) <= 1, stats
    # One worker delivers 50 of the 125 batches/s asked: the loop waits 60 % of its time.
    stall = 1 - min(count * WORKER_RATE * STEP_S, 1.0)
    assert stats.input_stall_fraction == pytest.approx(stall, abs=0.15)


def test_local_members_count_first() -> None:
    remote = {"grpc://a": 50.0, "grpc://b": 50.0}
    assert workers_wanted(125.0, remote) == 4
    # A local member delivering 30/s leaves 92.5 for workers: 2 of them, and one to spare.
    assert workers_wanted(125.0, {**remote, "local 0": 30.0}) == 3
    assert workers_wanted(125.0, {**remote, "local 0": 130.0}) == 0
    assert workers_wanted(125.0, {"local 0": 130.0}) is None
    assert workers_wanted(125.0, remote, stall_target=0.5) == 3
