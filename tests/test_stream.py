"""Tests for streams (filter, pack): batches of the survivors in plan order, cursors, every mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from equivalence import digests
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from jax.sharding import Mesh
from pipelines import numbers
from stream_pipelines import odd_numbers, packed_sequences, sequence
from workers import worker_process

from loadax import Batcher, DataLoader, InMemoryDataset, Plan, RangeDataset, RecordError
from loadax.client import RemoteDataLoader
from loadax.dataset.packing import SEGMENT_IDS
from loadax.dataset.stream import Stream
from loadax.errors import WorkerError
from loadax.plan.work import StreamWindow, shard_length, window_positions
from loadax.server.worker import Worker
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

BATCH = 8


def _survivors(plan: Plan, keep: Any, shards: int = 1, shard: int = 0) -> list[int]:
    """The records of a shard's stream that `keep` keeps, in order, computed the slow way."""
    total = plan.num_records * (plan.num_epochs or 0)
    positions = np.arange(shard, total, shards, dtype=np.int64)
    indices, _ = plan.records_at(positions)
    return [index for index in indices.tolist() if keep(index)]


def _numbers(records: int) -> Any:
    return RangeDataset(0, records).map(lambda i: {"x": np.int64(i)})


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("window", [1, 7, 256])
@pytest.mark.parametrize("workers", [0, 3])
def test_a_filter_batches_the_survivors_in_plan_order(
    shuffle: bool, window: int, workers: int
) -> None:
    def keep(index: int) -> bool:
        return index % 3 != 1

    builder = DataLoader(Batcher()).batch_size(BATCH).num_epochs(3).workers(workers)
    if shuffle:
        builder = builder.shuffle(seed=9)
    stream = Stream(_numbers(50), window=window).filter(lambda record: keep(int(record["x"])))
    loader = builder.build(stream)
    expected = _survivors(loader.plan, keep)
    got = [batch["x"].tolist() for batch in loader]
    assert [index for batch in got for index in batch] == expected
    assert [len(batch) for batch in got] == [BATCH] * (len(expected) // BATCH) + (
        [len(expected) % BATCH] if len(expected) % BATCH else []
    )


def test_drop_remainder_drops_the_short_last_batch_of_a_stream() -> None:
    stream = _numbers(30).filter(lambda record: int(record["x"]) % 2 == 0)
    builder = DataLoader(Batcher()).batch_size(4)
    assert [len(batch["x"]) for batch in builder.build(stream)] == [4, 4, 4, 3]
    assert [len(batch["x"]) for batch in builder.drop_remainder().build(stream)] == [4, 4, 4]


@pytest.mark.parametrize("factory", [odd_numbers, packed_sequences])
def test_restoring_a_stream_at_every_step_yields_the_same_batches(factory: Any) -> None:
    stream = factory().dataset
    for workers in (0, 2):
        loader = (
            DataLoader(Batcher())
            .batch_size(BATCH)
            .shuffle(seed=3)
            .num_epochs(2)
            .workers(workers)
            .build(stream)
        )
        assert_equal_output_after_checkpoint(loader)


def test_a_stream_state_is_a_small_cursor() -> None:
    loader = (
        DataLoader(Batcher()).batch_size(4).workers(2).build(odd_numbers(200, window=16).dataset)
    )
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    state = iterator.get_state()
    # 20 rows taken; a window of 16 positions holds 8 survivors: 4 rows into window 2.
    assert state["stream"] == {"window": 16, "shards": 1, "cursors": {"0": [2, 4]}, "taken": 20}
    assert len(json.dumps(state)) < 400  # the pipeline's fingerprint is 64 of it


def test_an_endless_stream_keeps_going_across_epochs() -> None:
    loader = (
        DataLoader(Batcher())
        .batch_size(4)
        .num_epochs(None)
        .shuffle(seed=1)
        .build(_numbers(10).filter(lambda record: int(record["x"]) < 5))
    )
    iterator = iter(loader)
    batches = [next(iterator)["x"].tolist() for _ in range(10)]
    flat = [index for batch in batches for index in batch]
    # Every epoch keeps records 0..4 in its own shuffled order.
    for epoch in range(8):
        assert sorted(flat[5 * epoch : 5 * epoch + 5]) == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="a stream's loader has no length"):
        len(loader)


def test_a_sharded_stream_gives_each_data_shard_its_own_stream() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))

    def keep(index: int) -> bool:
        return index % 5 != 0

    loader = (
        DataLoader(Batcher())
        .batch_size(8)
        .shuffle(seed=2)
        .num_epochs(2)
        .shard(mesh, "data")
        .build(_numbers(60).filter(lambda record: keep(int(record["x"]))))
    )
    shards = [_survivors(loader.plan, keep, shards=4, shard=shard) for shard in range(4)]
    steps = min(len(stream) for stream in shards) // 2
    batches = list(loader)
    assert len(batches) == steps
    for step, batch in enumerate(batches):
        expected = [index for stream in shards for index in stream[2 * step : 2 * step + 2]]
        assert batch["x"].tolist() == expected
    assert_equal_output_after_checkpoint(loader)


def test_device_prefetch_checkpoints_a_stream_before_the_batches_on_the_device() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    stream = _numbers(80).filter(lambda record: int(record["x"]) % 3 == 0)
    builder = DataLoader(Batcher()).batch_size(4).shard(mesh, "data").workers(2)
    expected = list(builder.build(stream))
    loader = builder.device_prefetch(2).build(stream)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    restored = iter(builder.build(stream))
    restored.set_state(iterator.get_state())
    assert_batches_equal(restored, expected[2:])


def test_packed_rows_hold_every_token_of_the_surviving_sequences() -> None:
    pipeline = packed_sequences(records=120, window=32, length=16)
    loader = DataLoader(Batcher()).batch_size(4).num_epochs(1).build(pipeline.dataset)
    tokens = []
    for batch in loader:
        assert batch["inputs"].shape == batch[SEGMENT_IDS].shape == (len(batch["inputs"]), 16)
        for row, ids in zip(batch["inputs"], batch[SEGMENT_IDS], strict=True):
            for segment in range(1, int(ids.max()) + 1):
                tokens.append(row[ids == segment].tolist())
    expected = [sequence(i)["inputs"].tolist() for i in range(120)]
    assert sorted(tokens) == sorted(seq for seq in expected if seq)


def test_filtering_and_packing_are_the_same_in_every_mode(tmp_path: Path) -> None:
    for factory in (odd_numbers, packed_sequences):
        name = factory.__name__
        local = DataLoader(Batcher()).batch_size(BATCH).shuffle(seed=5).num_epochs(2).workers(4)
        reference = digests(local.build(factory().dataset))
        inline = digests(local.workers(0).build(factory().dataset))
        assert inline == reference

        def remote(targets: list[Any], name: str = name) -> RemoteDataLoader:
            return (
                RemoteDataLoader(targets, pipeline=name)
                .batch_size(BATCH)
                .shuffle(seed=5)
                .num_epochs(2)
                .prefetch(3)
            )

        worker = Worker({name: factory()}, threads=2)
        try:
            with remote([worker]).build() as built:
                assert digests(built) == reference
                # A checkpoint of the remote iterator restores in a local one, and back.
                iterator = iter(built)
                for _ in range(3):
                    next(iterator)
                state = json.loads(json.dumps(iterator.get_state()))
                resumed = iter(local.build(factory().dataset))
                resumed.set_state(state)
                assert digests(resumed) == reference[3:]
        finally:
            worker.close()
        with (
            worker_process(
                tmp_path, f'[pipelines.{name}]\nfactory = "stream_pipelines:{name}"\n'
            ) as process,
            remote([process.grpc, process.grpc]).build() as built,
        ):
            assert digests(built) == reference


def test_a_failing_predicate_names_the_record() -> None:
    def predicate(record: dict[str, Any]) -> bool:
        if int(record["x"]) == 13:
            raise ValueError("bad record")
        return True

    stream = Stream(_numbers(20), window=4).filter(predicate)
    loader = DataLoader(Batcher()).batch_size(4).workers(2).build(stream)
    iterator = iter(loader)
    assert [next(iterator)["x"].tolist() for _ in range(3)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]
    with pytest.raises(RecordError, match="record 13 \\(epoch 0\\) failed: ValueError: bad record"):
        next(iterator)
    # The cursor did not move: the failed batch is tried again.
    assert iterator.get_state()["step"] == 3


def test_a_predicate_that_does_not_return_a_bool_is_named() -> None:
    loader = (
        DataLoader(Batcher()).batch_size(2).build(InMemoryDataset([1, 2, 3]).filter(lambda x: None))
    )
    with pytest.raises(RecordError, match="returned None; it must return a bool"):
        next(iter(loader))


def test_streams_refuse_what_they_cannot_do() -> None:
    with pytest.raises(ValueError, match=r"batched by stacking its rows: use Batcher\(\)"):
        DataLoader(Batcher(lambda xs: xs)).batch_size(2).build(InMemoryDataset([1]).filter(bool))
    with pytest.raises(ValueError, match="a stream reads a random-access dataset"):
        Stream(iter([1, 2]))
    with pytest.raises(ValueError, match="window must be >= 1"):
        Stream([1], window=0)
    with pytest.raises(ValueError, match="predicate must be callable"):
        Stream([1]).filter(3)
    loader = DataLoader(Batcher()).batch_size(2).build(_numbers(10).filter(bool))
    random_access = iter(DataLoader(Batcher()).batch_size(2).build(_numbers(10)))
    with pytest.raises(ValueError, match="is it the state of a random-access loader"):
        iter(loader).set_state(random_access.get_state())
    state = iter(loader).get_state()
    with pytest.raises(ValueError, match="window is 3 in the state but 256 in this loader"):
        iter(loader).set_state({**state, "stream": {**state["stream"], "window": 3}})
    with pytest.raises(ValueError, match="restore each process's own state"):
        iter(loader).set_state({**state, "stream": {**state["stream"], "cursors": {"1": [0, 0]}}})


def test_window_positions_cover_each_shard_stream_once() -> None:
    plan = Plan(num_records=7, batch_size=2, num_epochs=3)
    for shards in (1, 2, 3):
        seen = []
        for shard in range(shards):
            length = shard_length(plan, shards, shard)
            assert length is not None
            windows = -(-length // 4)
            for index in range(windows):
                seen.extend(window_positions(plan, 4, StreamWindow(shards, shard, index)).tolist())
            with pytest.raises(IndexError, match="beyond the end of its stream"):
                window_positions(plan, 4, StreamWindow(shards, shard, windows))
        assert sorted(seen) == list(range(21))


def _window_request(name: str, worker: Worker, **window: int) -> wire.BatchRequest:
    info = {pipeline.name: pipeline for pipeline in worker.info(wire.InfoRequest()).pipelines}
    return wire.BatchRequest(
        pipeline=name,
        fingerprint=info[name].fingerprint,
        plan=plan_to_wire(Plan(num_records=info[name].num_records, batch_size=4)),
        window=wire.StreamWindow(**window),
    )


def test_the_worker_refuses_bad_window_requests_by_name() -> None:
    worker = Worker({"odd": odd_numbers(), "numbers": numbers()}, threads=1)
    try:
        ok = worker.load_batch(_window_request("odd", worker, shards=1, shard=0, index=0))
        assert ok.payload
        cases = [
            (_window_request("numbers", worker, shards=1), "FAILED_PRECONDITION", "random-access"),
            (
                wire.BatchRequest(
                    pipeline="odd",
                    fingerprint=_window_request("odd", worker).fingerprint,
                    plan=_window_request("odd", worker).plan,
                ),
                "FAILED_PRECONDITION",
                "is a stream (filter, pack): ask for windows",
            ),
            (
                _window_request("odd", worker, shards=2, shard=2),
                "INVALID_ARGUMENT",
                "shard must be <",
            ),
            (_window_request("odd", worker, shards=0), "INVALID_ARGUMENT", "shards must be >= 1"),
            (_window_request("odd", worker, shards=1, index=13), "OUT_OF_RANGE", "beyond the end"),
            (
                _window_request("odd", worker, shards=2**63, shard=1, index=2**63),
                "OUT_OF_RANGE",
                "beyond the end",
            ),
        ]
        with_rows = _window_request("odd", worker, shards=1)
        with_rows.rows.append(0)
        cases.append((with_rows, "INVALID_ARGUMENT", "a window request has no rows"))
        for request, code, message in cases:
            with pytest.raises(WorkerError) as raised:
                worker.load_batch(request)
            assert raised.value.code == code
            assert message in raised.value.message
        endless = _window_request("odd", worker, shards=3, shard=1, index=2**61)
        endless.plan.ClearField("num_epochs")
        with pytest.raises(WorkerError, match="more than loadax can address") as raised:
            worker.load_batch(endless)
        assert raised.value.code == "OUT_OF_RANGE"
    finally:
        worker.close()
