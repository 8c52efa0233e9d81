"""Bad-record policies: skip and replace give the same batches in every mode and after a resume,
report each bad record, stop at the budget, and never take a storage outage for a bad record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from jax.sharding import Mesh
from record_error_pipelines import BAD, decoded, flaky, good, unreachable
from workers import worker_process

from loadax import Batcher, DataLoader, RangeDataset, StorageError
from loadax.client import RemoteDataLoader
from loadax.errors import TooManyBadRecords
from loadax.server.worker import Worker

RECORDS, BATCH, EPOCHS = 40, 6, 2


def builder(mode: str, budget: int | float = 10) -> DataLoader[Any, Any]:
    return (
        DataLoader(Batcher())
        .batch_size(BATCH)
        .shuffle(seed=3)
        .num_epochs(EPOCHS)
        .on_record_error(mode, budget=budget)  # type: ignore[arg-type]
    )


def expected(mode: str, shuffle: bool = True) -> list[Any]:
    """The batches by hand: the plan's rows without the bad records, or each filled with the
    next good record of its epoch (wrapping)."""
    plain = DataLoader(Batcher()).batch_size(BATCH).num_epochs(EPOCHS)
    plain = plain.shuffle(seed=3) if shuffle else plain
    batches = [batch.tolist() for batch in plain.build(RangeDataset(0, RECORDS))]
    per_epoch = len(batches) // EPOCHS
    result = []
    for epoch in range(EPOCHS):
        steps = batches[epoch * per_epoch : (epoch + 1) * per_epoch]
        order = [index for batch in steps for index in batch]
        for batch in steps:
            if mode == "skip":
                kept = [index for index in batch if index not in BAD]
            else:
                kept = [_next_good(order, order.index(index)) for index in batch]
            result.append(Batcher()([good(index) for index in kept]))
    return result


def _next_good(order: list[int], position: int) -> int:
    while order[position % len(order)] in BAD:
        position += 1
    return order[position % len(order)]


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_the_batches_are_the_same_for_every_executor_and_worker(mode: str, tmp_path: Path) -> None:
    dataset = RangeDataset(0, RECORDS).map(decoded)
    want = expected(mode)
    assert_batches_equal(builder(mode).workers(0).build(dataset), want)
    assert_batches_equal(builder(mode).workers(2).build(dataset), want)
    with builder(mode).workers(2, kind="processes").build(dataset) as loader:
        assert_batches_equal(loader, want)
    worker = Worker({"flaky": flaky(RECORDS)}, threads=2)
    try:
        remote = RemoteDataLoader([worker], pipeline="flaky").batch_size(BATCH).shuffle(seed=3)
        remote = remote.num_epochs(EPOCHS).on_record_error(mode, budget=10)  # type: ignore[arg-type]
        with remote.build() as loader:
            assert_batches_equal(loader, want)
            assert loader.stats().bad_record_count == len(BAD) * EPOCHS
    finally:
        worker.close()
    config = (
        '[pipelines.flaky]\nfactory = "record_error_pipelines:flaky"\n'
        f"args = {{ records = {RECORDS} }}\n"
    )
    with worker_process(tmp_path, config) as process:
        remote = RemoteDataLoader([process.grpc], pipeline="flaky").batch_size(BATCH)
        remote = remote.shuffle(seed=3).num_epochs(EPOCHS).on_record_error(mode, budget=10)  # type: ignore[arg-type]
        with remote.build() as loader:
            assert_batches_equal(loader, want)


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_a_resume_at_every_step_gives_the_same_batches(mode: str) -> None:
    loader = builder(mode).workers(2).build(RangeDataset(0, RECORDS).map(decoded))
    assert_equal_output_after_checkpoint(loader)


def test_a_replacement_wraps_to_the_epochs_start_and_every_bad_record_is_reported() -> None:
    unshuffled = DataLoader(Batcher()).batch_size(BATCH).num_epochs(EPOCHS)
    loader = unshuffled.on_record_error("replace", budget=5).build(
        RangeDataset(0, RECORDS).map(decoded)
    )
    assert_batches_equal(loader, expected("replace", shuffle=False))
    stats = loader.stats()
    assert stats.bad_record_count == len(BAD) * EPOCHS
    last = stats.bad_records[-1]
    assert (last.index, last.epoch, last.step, last.row) == (39, 1, 13, 3)
    assert last.cause == "ValueError: record 39 is corrupt"
    assert last.action == "replaced by record 0"  # 39 ends the epoch: its start comes next


def test_more_bad_records_than_the_budget_is_an_error_at_the_same_step_everywhere() -> None:
    dataset = RangeDataset(0, RECORDS).map(decoded)
    steps = []
    for workers in (0, 2):
        iterator = iter(builder("skip", budget=2).workers(workers).build(dataset))
        with pytest.raises(TooManyBadRecords, match="3 bad records in epoch 0, more than the"):
            for _ in iterator:
                pass
        steps.append(iterator.step)
    assert steps[0] == steps[1]
    # By default 0.1 % of an epoch, at least one record.
    with pytest.raises(TooManyBadRecords, match="budget of 1"):
        list(DataLoader(Batcher()).batch_size(BATCH).on_record_error("skip").build(dataset))


def test_a_storage_outage_is_never_a_bad_record() -> None:
    dataset = RangeDataset(0, 12).map(unreachable)
    for mode in ("skip", "replace"):
        with pytest.raises(StorageError, match="cannot reach"):
            list(DataLoader(Batcher()).batch_size(4).on_record_error(mode).build(dataset))  # type: ignore[arg-type]


def test_policies_refuse_what_they_cannot_do() -> None:
    with pytest.raises(ValueError, match="on_record_error must be one of"):
        DataLoader(Batcher()).on_record_error("ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"budget=\.\.\.\) must be an int >= 0"):
        DataLoader(Batcher()).on_record_error("skip", budget=1.5)
    stream = RangeDataset(0, 8).filter(bool)
    with pytest.raises(ValueError, match="applies to random-access pipelines"):
        DataLoader(Batcher()).batch_size(2).on_record_error("skip").build(stream)
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    with pytest.raises(ValueError, match="use on_record_error\\('replace'\\)"):
        DataLoader(Batcher()).batch_size(2).shard(mesh).on_record_error("skip").build([1, 2])
    sums = DataLoader(Batcher(sum)).batch_size(4).on_record_error("replace", budget=5)
    with pytest.raises(ValueError, match="splices rows into the batch"):
        list(sums.build(RangeDataset(0, 8).map(lambda x: 1 // (x - 5))))
