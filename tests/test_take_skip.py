"""take(n) and skip(n) on datasets and on streams: the list slices' meaning, checkpointable."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from jax.sharding import Mesh

from loadax import Batcher, DataLoader, Pipeline, RangeDataset, Stream
from loadax.server.worker import Worker


@pytest.mark.parametrize("count", [0, 3, 10, 25])
def test_take_and_skip_are_the_list_slices(count: int) -> None:
    records = list(range(10))
    dataset = RangeDataset(0, 10).shuffle(seed=4)
    shuffled = list(dataset)
    assert list(dataset.take(count)) == shuffled[:count]
    assert list(dataset.skip(count)) == shuffled[count:]
    assert list(RangeDataset(0, 10).skip(2).take(count)) == records[2:][:count]
    assert list(RangeDataset(0, 10).take(count).skip(2)) == records[:count][2:]


def test_take_and_skip_refuse_a_negative_count() -> None:
    with pytest.raises(ValueError, match="take must be >= 0, got -1"):
        RangeDataset(0, 4).take(-1)
    with pytest.raises(ValueError, match="skip must be >= 0, got -2"):
        RangeDataset(0, 4).filter(bool).skip(-2)


def test_a_held_out_split_restores_at_every_step() -> None:
    held_out = RangeDataset(0, 30).shuffle(seed=1).skip(20)
    builder = DataLoader(Batcher()).batch_size(3).shuffle(seed=2).num_epochs(2)
    assert_equal_output_after_checkpoint(builder.build(held_out))


def odd(value: int) -> bool:
    return value % 2 == 1


def test_stream_take_and_skip_count_the_items_that_survive() -> None:
    stream = RangeDataset(0, 100).filter(odd)
    odds = [value for value in range(100) if odd(value)]
    builder = DataLoader(Batcher()).batch_size(4)
    for window in (3, 256):
        windowed = Stream(RangeDataset(0, 100), window=window).filter(odd)
        got = np.concatenate(list(builder.build(windowed.skip(5).take(9).map(int))))
        assert got.tolist() == odds[5:14]
    assert repr(stream.skip(5).take(9)) == "RangeDataset(0, 100).filter(odd).skip(5).take(9)"
    assert [len(batch) for batch in builder.drop_remainder().build(stream.take(9))] == [4, 4]
    assert list(builder.build(stream.take(0))) == []
    assert list(builder.build(stream.skip(60))) == []


def test_stream_take_and_skip_restore_at_every_step() -> None:
    stream = Stream(RangeDataset(0, 30), window=4).filter(odd).skip(3).take(11)
    builder = DataLoader(Batcher()).batch_size(2).num_epochs(2)
    assert_equal_output_after_checkpoint(builder.build(stream))


def test_a_streams_take_counts_the_rows_of_a_batch_size_schedule() -> None:
    odds = [value for value in range(100) if odd(value)]
    stream = Stream(RangeDataset(0, 100), window=8).filter(odd).take(9)
    builder = DataLoader(Batcher()).batch_size_schedule([(0, 2), (2, 4)])
    loader = builder.build(stream)
    assert [batch.tolist() for batch in loader] == [[1, 3], [5, 7], [9, 11, 13, 15], [17]]
    assert_equal_output_after_checkpoint(loader)
    # A resume with a new batch size goes on counting the rows taken, not the new plan's.
    iterator = iter(builder.build(stream))
    next(iterator), next(iterator)
    resumed = iter(DataLoader(Batcher()).batch_size(3).build(stream))
    resumed.set_state(iterator.get_state(), allow_new_batch_size=True)
    assert np.concatenate(list(resumed)).tolist() == odds[4:9]
    # A state saved before the rows taken were recorded derives them from its plan.
    iterator = iter(loader)
    next(iterator), next(iterator), next(iterator)
    state = iterator.get_state()
    del state["stream"]["taken"]
    restored = iter(loader)
    restored.set_state(state)
    assert [batch.tolist() for batch in restored] == [[17]]


def test_a_filter_or_pack_after_take_is_refused() -> None:
    with pytest.raises(ValueError, match=r"filter\(odd\) after take/skip"):
        RangeDataset(0, 10).filter(bool).take(3).filter(odd)


def test_data_shards_share_a_streams_take_and_skip() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    builder = DataLoader(Batcher()).batch_size(4).shard(mesh)
    stream = RangeDataset(0, 40).filter(lambda value: value % 5 != 0)
    whole = [np.asarray(batch) for batch in builder.build(stream)]
    # Shard s reads positions s, s + 2, ...: its items are its half of each batch, in order.
    shards = [np.concatenate([batch[2 * s : 2 * s + 2] for batch in whole]) for s in (0, 1)]
    limited = [np.asarray(batch) for batch in builder.build(stream.skip(2).take(10))]
    # Each shard skips 1 item, then yields 5: batches of 2 + 2 rows, the last one short.
    expected = [
        np.concatenate([shard[1 + i : 1 + i + n] for shard in shards])
        for i, n in ((0, 2), (2, 2), (4, 1))
    ]
    assert_batches_equal(limited, expected)
    with pytest.raises(ValueError, match="multiples of its 2 data shards"):
        next(iter(builder.build(stream.take(3))))


def test_a_worker_refuses_a_stream_whose_client_could_not_cut_it() -> None:
    stream = RangeDataset(0, 10).filter(odd).take(2)
    with pytest.raises(ValueError, match=r"pipeline 'odd': a stream's take/skip \(\.take\(2\)\)"):
        Worker({"odd": Pipeline(stream, Batcher())})
