"""Block shuffles (`.shuffle(seed, block_size=, window=)`): every record once per epoch, each
window made of its blocks' records, the same batches with 0 or 2 threads, processes and a worker,
an exact resume in the middle of a window, and the plans without blocks as they were."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax import Batcher, DataLoader, Pipeline, Plan, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.plan.blocks import BlockShuffle
from loadax.plan.buckets import LengthBuckets
from loadax.plan.work import StepWork
from loadax.server.worker import Worker
from loadax.wire.plans import batch_request, plan_from_wire, plan_to_wire, request_digest

RECORDS, BATCH = 45, 5  # 11 blocks of 4 and a tail of 1; windows of 12 records
BLOCKS = BlockShuffle(block_size=4, window=3)


def blocked(builder: DataLoader) -> DataLoader:
    return builder.batch_size(BATCH).shuffle(seed=7, block_size=4, window=3).num_epochs(2)


@settings(max_examples=20, deadline=None)
@given(
    records=st.integers(1, 150),
    block=st.integers(1, 12),
    window=st.integers(1, 5),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 2),
)
def test_every_record_comes_once_per_epoch_and_each_window_from_its_blocks(
    records: int, block: int, window: int, seed: int, epoch: int
) -> None:
    blocks = BlockShuffle(block, window)
    plan = Plan(records, 7, seed=seed, shuffle=True, num_epochs=epoch + 1, blocks=blocks)
    order = np.concatenate([plan.indices(step) for step in plan.epoch_steps(epoch)])
    assert sorted(order.tolist()) == list(range(records))
    streamed, _ = plan.records_at(np.arange(records) + epoch * records)  # a stream's order
    assert streamed.tolist() == order.tolist()
    windows = blocks.windows(records, seed, epoch, np.arange(records))
    assert np.all(np.diff(windows) >= 0), "a window's records come together"
    for number in range(blocks.window_count(records)):
        starts, stops = blocks.window_ranges(records, seed, epoch, number)
        assert int((stops - starts).sum()) < (window + 1) * block  # its blocks and the tail
        expected = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops, strict=True)])
        assert sorted(order[windows == number].tolist()) == expected.tolist()


def test_epochs_differ_and_the_blocks_are_shuffled() -> None:
    plan = Plan(RECORDS, BATCH, seed=7, shuffle=True, num_epochs=2, blocks=BLOCKS)
    first, second = (np.concatenate([plan.indices(s) for s in plan.epoch_steps(e)]) for e in (0, 1))
    assert first.tolist() != second.tolist()
    assert sorted(first[:12] // 4) != [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert first[:12].tolist() != sorted(first[:12].tolist())  # shuffled within the window


def test_the_batches_are_the_same_with_0_or_2_threads_processes_and_a_worker() -> None:
    dataset = RangeDataset(0, RECORDS)
    expected = list(blocked(DataLoader(Batcher())).workers(0).build(dataset))
    assert sorted(np.concatenate(expected[:9]).tolist()) == list(range(RECORDS))
    for kind in ("threads", "processes"):
        loader = blocked(DataLoader(Batcher())).workers(2, kind=kind).build(dataset)
        assert_batches_equal(loader, expected)
    worker = Worker({"range": Pipeline(dataset, Batcher())}, threads=2)
    try:
        with blocked(RemoteDataLoader([worker], pipeline="range")).build() as batches:
            assert_batches_equal(batches, expected)
    finally:
        worker.close()


def test_a_resume_mid_window_continues_exactly_also_in_a_new_batch_size() -> None:
    loader = blocked(DataLoader(Batcher())).workers(0).build(RangeDataset(0, RECORDS))
    assert_equal_output_after_checkpoint(loader)
    iterator = iter(loader)
    delivered = np.concatenate([next(iterator) for _ in range(3)])  # 15 of window 1's 12..23
    state = json.loads(json.dumps(iterator.get_state()))
    assert state["plan"]["blocks"] == {"block_size": 4, "window": 3}
    smaller = blocked(DataLoader(Batcher())).batch_size(2).workers(0)
    resumed = iter(smaller.build(RangeDataset(0, RECORDS)))
    resumed.set_state(state, allow_new_batch_size=True)
    rest = np.concatenate(list(resumed))
    again = blocked(DataLoader(Batcher())).workers(0).build(RangeDataset(0, RECORDS))
    assert np.concatenate([delivered, rest]).tolist() == np.concatenate(list(again)).tolist()
    plain = iter(DataLoader(Batcher()).batch_size(BATCH).shuffle(seed=7).build(range(RECORDS)))
    with pytest.raises(ValueError, match="blocks"):
        plain.set_state(state)


def test_the_plan_travels_to_a_worker_with_its_blocks_and_a_digest_of_them() -> None:
    plan = Plan(RECORDS, BATCH, seed=7, shuffle=True, blocks=BLOCKS)
    assert plan_from_wire(plan_to_wire(plan)) == plan
    unblocked = Plan(RECORDS, BATCH, seed=7, shuffle=True)
    assert plan_from_wire(plan_to_wire(unblocked)).blocks is None
    digests = {request_digest(batch_request("p", "f", p, StepWork(0))) for p in (plan, unblocked)}
    assert len(digests) == 2  # a worker blind to the blocks answers with another digest


def test_plans_without_blocks_are_as_they_were() -> None:
    plan = Plan(RECORDS, BATCH, seed=7, shuffle=True, num_epochs=2)
    # The records and description of loadax before block shuffles.
    assert [plan.indices(step).tolist() for step in (0, 9, 17)] == [
        [20, 28, 11, 31, 32],
        [25, 17, 20, 0, 29],
        [5, 1, 6, 31, 27],
    ]
    assert "blocks" not in plan.describe()
    assert StepWork(0).windows(plan) == []


def test_bad_block_shuffles_are_named() -> None:
    with pytest.raises(ValueError, match="block_size and window, both"):
        DataLoader(Batcher()).shuffle(seed=1, block_size=4)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        DataLoader(Batcher()).shuffle(block_size=0, window=2)
    with pytest.raises(ValueError, match="window must be an int"):
        BlockShuffle(4, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="need shuffle=True"):
        Plan(RECORDS, BATCH, blocks=BLOCKS)
    with pytest.raises(ValueError, match="no length buckets"):
        Plan(4, 2, shuffle=True, blocks=BLOCKS, buckets=LengthBuckets([1, 2, 3, 4], [3]))
