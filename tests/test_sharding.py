"""Rows per process from the mesh, global arrays, device prefetch, and sharding presets."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from jax.sharding import Mesh

from loadax import Batcher, DataLoader, RangeDataset, RecordError
from loadax.delivery.meshes import ddp_sharding, fsdp_sharding
from loadax.delivery.sharding import ShardingStrategy, rows_for_devices

DEVICES = np.array(jax.devices())
# Two pretend processes of four devices each: rows are derived for a set of devices.
FIRST_HALF, SECOND_HALF = set(DEVICES[:4]), set(DEVICES[4:])


def rows(mesh: Mesh, axis: Any, devices: set[Any], batch: int = 16) -> list[int]:
    return rows_for_devices(ShardingStrategy(mesh, axis).sharding, batch, devices).tolist()


def test_eight_devices_are_available() -> None:
    assert len(DEVICES) == 8


def test_contiguous_devices_hold_contiguous_rows() -> None:
    mesh = Mesh(DEVICES, ("data",))
    assert rows(mesh, "data", FIRST_HALF) == list(range(8))
    assert rows(mesh, "data", SECOND_HALF) == list(range(8, 16))


def test_interleaved_devices_hold_interleaved_rows() -> None:
    mesh = Mesh(DEVICES.reshape(2, 4).T.reshape(-1), ("data",))  # d0 d4 d1 d5 d2 d6 d3 d7
    assert rows(mesh, "data", FIRST_HALF) == [0, 1, 4, 5, 8, 9, 12, 13]
    assert rows(mesh, "data", SECOND_HALF) == [2, 3, 6, 7, 10, 11, 14, 15]


def test_devices_sharing_a_data_row_over_a_model_axis_load_the_same_rows() -> None:
    within = Mesh(DEVICES.reshape(4, 2), ("data", "model"))
    assert rows(within, "data", FIRST_HALF) == list(range(8))
    across = Mesh(DEVICES.reshape(2, 4).T, ("data", "model"))  # each row: one device per half
    assert rows(across, "data", FIRST_HALF) == list(range(16))
    assert rows(across, "data", SECOND_HALF) == list(range(16))
    assert rows(across, "data", {DEVICES[0]}) == [0, 1, 2, 3]


def test_a_tuple_of_data_axes_splits_over_their_product() -> None:
    mesh = Mesh(DEVICES.reshape(2, 4), ("replica", "data"))
    strategy = ShardingStrategy(mesh, ("replica", "data"))
    assert strategy.num_data_shards == 8
    assert rows(mesh, ("replica", "data"), FIRST_HALF) == list(range(8))
    assert rows(mesh, ("replica", "data"), {DEVICES[5]}) == [10, 11]
    assert ShardingStrategy(mesh, "data").num_data_shards == 4


def test_one_process_with_every_device_loads_every_row() -> None:
    strategy = ShardingStrategy(Mesh(DEVICES, ("data",)), "data")
    assert strategy.rows(16) is None


def test_a_global_array_puts_each_row_on_the_device_that_holds_it() -> None:
    mesh = Mesh(DEVICES.reshape(4, 2), ("data", "model"))
    strategy = ShardingStrategy(mesh, "data")
    local = {"x": np.arange(16 * 3).reshape(16, 3), "y": np.arange(16)}
    batch = strategy.distribute_global_batch(local)
    assert batch["x"].shape == (16, 3)
    assert batch["x"].sharding == strategy.sharding
    for shard in batch["x"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), local["x"][shard.index])
        assert shard.data.shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(batch["y"]), local["y"])


def test_a_sharded_leaf_needs_a_batch_dimension() -> None:
    strategy = ShardingStrategy(Mesh(DEVICES, ("data",)), "data")
    with pytest.raises(ValueError, match="batch dimension"):
        strategy.distribute_global_batch({"scalar": np.float32(1)})


def test_a_local_batch_that_does_not_split_into_the_shards_is_rejected() -> None:
    strategy = ShardingStrategy(Mesh(DEVICES, ("data",)), "data")
    with pytest.raises(ValueError, match="does not split into the 8 data shards"):
        strategy.distribute_global_batch(np.zeros(12))


def sharded(mesh: Mesh, axis: Any = "data", batch: int = 8) -> DataLoader[Any, Any]:
    return (
        DataLoader(Batcher())
        .batch_size(batch)
        .shuffle(seed=2)
        .num_epochs(2)
        .workers(2)
        .shard(mesh, data_axis_name=axis)
    )


DATASET = RangeDataset(0, 40).map(lambda i: {"x": np.full(2, i, np.float32), "i": i})


def test_sharding_in_one_process_gives_the_unsharded_batches() -> None:
    unsharded = DataLoader(Batcher()).batch_size(8).shuffle(seed=2).num_epochs(2).build(DATASET)
    loader = sharded(Mesh(DEVICES, ("data",))).build(DATASET)
    assert_batches_equal(loader, unsharded)
    assert loader.sharding_strategy.num_data_shards == 8


def test_device_prefetch_yields_global_arrays_of_the_same_batches() -> None:
    host = sharded(Mesh(DEVICES, ("data",))).build(DATASET)
    device = sharded(Mesh(DEVICES, ("data",))).device_prefetch(2).build(DATASET)
    batches = list(device)
    assert all(isinstance(batch["x"], jax.Array) for batch in batches)
    assert all(batch["x"].sharding == host.sharding_strategy.sharding for batch in batches)
    assert_batches_equal(batches, host)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_device_prefetch_restores_at_every_step(depth: int) -> None:
    loader = sharded(Mesh(DEVICES.reshape(4, 2), ("data", "model"))).device_prefetch(depth)
    assert_equal_output_after_checkpoint(loader.build(DATASET))


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_device_prefetch_keeps_exactly_depth_batches_ahead(depth: int) -> None:
    read: list[int] = []

    def record(i: int) -> int:
        read.append(i)
        return i

    loader = (
        DataLoader(Batcher())
        .batch_size(4)
        .workers(0)  # no host prefetch: every read is the device iterator's doing
        .device_prefetch(depth)
        .build(RangeDataset(0, 40).map(record))
    )
    iterator = iter(loader)
    for step in range(len(loader)):
        batch = next(iterator)
        np.testing.assert_array_equal(batch, range(4 * step, 4 * step + 4))
        taken = min(step + 1 + depth, len(loader))  # this batch, then `depth` ahead
        assert sorted(read) == list(range(4 * taken)), f"depth {depth}, after step {step}"
    with pytest.raises(StopIteration):
        next(iterator)
    assert sorted(read) == list(range(40))


def test_a_state_saved_with_device_prefetch_restores_without_it() -> None:
    mesh = Mesh(DEVICES, ("data",))
    device_iterator = iter(sharded(mesh).device_prefetch(3).build(DATASET))
    next(device_iterator)
    next(device_iterator)
    state = device_iterator.get_state()
    assert state["step"] == 2
    host = sharded(mesh).build(DATASET)
    restored = iter(host)
    restored.set_state(state)
    assert_batches_equal(restored, list(host)[2:])
    device_iterator.close()


def test_device_prefetch_raises_a_failed_step_only_when_the_loop_reaches_it() -> None:
    def fail_on_20(i: int) -> np.ndarray[Any, Any]:
        if i == 20:
            raise OSError("unreadable")
        return np.full(2, i)

    loader = (
        DataLoader(Batcher())
        .batch_size(8)
        .shard(Mesh(DEVICES, ("data",)))
        .device_prefetch(3)
        .build(RangeDataset(0, 40).map(fail_on_20))
    )
    iterator = iter(loader)
    np.testing.assert_array_equal(next(iterator)[:, 0], range(8))
    np.testing.assert_array_equal(next(iterator)[:, 0], range(8, 16))
    with pytest.raises(RecordError, match="record 20"):
        next(iterator)
    assert iterator.get_state()["step"] == 2
    iterator.close()


def test_without_shard_the_global_batch_is_the_local_batch() -> None:
    loader = DataLoader(Batcher()).batch_size(4).build(DATASET)
    local = next(iter(loader))
    batch = loader.sharding_strategy.distribute_global_batch(local)
    assert isinstance(batch["x"], jax.Array)
    np.testing.assert_array_equal(np.asarray(batch["x"]), local["x"])
    assert loader.sharding_strategy.num_data_shards == 1
    assert loader.sharding_strategy.rows(4) is None


def test_a_global_batch_that_does_not_split_evenly_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="global batch size is 10, not divisible by the 8 shards"):
        sharded(Mesh(DEVICES, ("data",)), batch=10).build(DATASET)


def test_a_short_last_batch_that_does_not_split_evenly_names_drop_remainder() -> None:
    with pytest.raises(ValueError, match=r"last batch of an epoch .*drop_remainder.* is 4"):
        sharded(Mesh(DEVICES, ("data",)), batch=8).build(RangeDataset(0, 12))
    loader = sharded(Mesh(DEVICES, ("data",)), batch=8).drop_remainder().build(RangeDataset(0, 12))
    assert len(loader) == 2


@pytest.mark.parametrize(
    ("mesh", "axis", "message"),
    [
        (Mesh(DEVICES, ("data",)), "batch", r"data_axis_name \['batch'\] not in the mesh"),
        (Mesh(DEVICES.reshape(2, 4), ("a", "b")), ("a", "c"), r"\['c'\] not in the mesh"),
        (Mesh(DEVICES, ("data",)), (), "data_axis_name must be"),
        ("not a mesh", "data", "mesh must be a jax.sharding.Mesh"),
    ],
)
def test_bad_shard_arguments_are_value_errors(mesh: Any, axis: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(Batcher()).shard(mesh, data_axis_name=axis)


def test_device_prefetch_depth_is_checked() -> None:
    with pytest.raises(ValueError, match="device_prefetch"):
        DataLoader(Batcher()).device_prefetch(-1)


def test_presets_cover_every_device() -> None:
    ddp_mesh, ddp_axes = ddp_sharding()
    assert ddp_axes == ("data",)
    assert dict(ddp_mesh.shape) == {"data": 8}
    fsdp_mesh, fsdp_axes = fsdp_sharding()
    assert fsdp_axes == ("data", "model")
    assert dict(fsdp_mesh.shape) == {"data": 1, "model": 8}
    assert set(fsdp_mesh.devices.flat) == set(DEVICES)
