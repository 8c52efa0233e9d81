"""Which rows of the global batch this JAX process loads, and how they become global jax.Arrays.

The rows come from the sharding itself (the devices this process can address and the slices of
the batch they hold), not from "process p of P": non-contiguous device orders, model axes whose
devices share rows, and data axes spread over several mesh axes all work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loadax.plan.permutation import IndexArray

DataAxis = str | tuple[str, ...]


def data_axis_of(mesh: Mesh, data_axis_name: str | Sequence[str]) -> DataAxis:
    """`data_axis_name` checked against the mesh: one axis name, or a tuple of them."""
    names = (data_axis_name,) if isinstance(data_axis_name, str) else tuple(data_axis_name)
    if not names or not all(isinstance(name, str) for name in names):
        raise ValueError(f"data_axis_name must be an axis name or a tuple of them, got {names!r}")
    unknown = [name for name in names if name not in mesh.axis_names]
    if unknown:
        raise ValueError(f"data_axis_name {unknown} not in the mesh's axes {mesh.axis_names}")
    return names[0] if len(names) == 1 else names


class ShardingStrategy:
    """How global batches are split over a mesh along its data axis (or not split at all)."""

    def __init__(self, mesh: Mesh | None = None, data_axis: DataAxis | None = None) -> None:
        if (mesh is None) != (data_axis is None):
            raise ValueError("mesh and data_axis are given together or not at all")
        self.mesh, self.data_axis = mesh, data_axis
        self._rows_by_length: dict[int, IndexArray | None] = {}

    @property
    def sharding(self) -> jax.sharding.Sharding:
        """The sharding of the batch dimension of every leaf of a global batch.

        It is over the mesh as given, axis types and all: with explicit axes (the default of
        `jax.make_mesh`) a batch's type says it is split, `float32[16@data]`, as
        `jax.device_put(batch, NamedSharding(mesh, P("data")))` would make it.
        """
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        spec = PartitionSpec(self.data_axis)  # type: ignore[no-untyped-call]  # jax ships no stub
        return NamedSharding(self.mesh, spec)

    @property
    def num_data_shards(self) -> int:
        """Into how many parts a global batch is split."""
        if self.mesh is None:
            return 1
        axes = (self.data_axis,) if isinstance(self.data_axis, str) else self.data_axis or ()
        return math.prod(self.mesh.shape[axis] for axis in axes)

    def check_batch_length(self, length: int, what: str) -> None:
        """A ValueError unless a batch of `length` records splits evenly over the data shards."""
        if length % self.num_data_shards:
            raise ValueError(
                f"{what} is {length}, not divisible by the {self.num_data_shards} shards of "
                f"data axis {self.data_axis!r}"
            )

    def rows(self, batch_length: int) -> IndexArray | None:
        """The rows of a global batch this process loads, ascending; None for all of them."""
        if self.mesh is None:
            return None
        if batch_length not in self._rows_by_length:
            devices = self.sharding.addressable_devices
            rows = rows_for_devices(self.sharding, batch_length, devices)
            self._rows_by_length[batch_length] = None if rows.size == batch_length else rows
        return self._rows_by_length[batch_length]

    def distribute_global_batch(self, local_batch: Any) -> Any:
        """A pytree of global jax.Arrays from this process's rows; no data crosses hosts.

        Without a mesh the batch goes to this process's first device uncommitted, so that a
        jitted step may move it to its other arguments' devices (those of the mesh that
        `jax.set_mesh` sets, for one) instead of refusing them as incompatible devices.
        """
        if self.mesh is None:
            return jax.device_put(local_batch)
        return jax.tree.map(self._global_array, local_batch)

    def _global_array(self, local: Any) -> jax.Array:
        local = np.asarray(local)
        if local.ndim == 0:
            raise ValueError("every leaf of a sharded batch needs a batch dimension")
        batch_length = self._global_length(local.shape[0])
        rows = self.rows(batch_length)
        shape = (batch_length, *local.shape[1:])
        sharding = self.sharding
        shards = []
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            start, stop, _ = _batch_slice(index).indices(batch_length)
            first = start if rows is None else int(np.searchsorted(rows, start))
            shards.append(jax.device_put(local[first : first + stop - start], device))
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)

    def _global_length(self, local_length: int) -> int:
        # Each data shard this process holds is global_length / num_data_shards rows long.
        local_shards = self.rows(self.num_data_shards)
        count = self.num_data_shards if local_shards is None else local_shards.size
        if local_length % count:
            raise ValueError(
                f"a local batch of {local_length} rows does not split into the {count} data "
                "shards this process holds"
            )
        return local_length // count * self.num_data_shards


def rows_for_devices(
    sharding: jax.sharding.Sharding, batch_length: int, devices: Iterable[jax.Device]
) -> IndexArray:
    """The rows of a batch of `batch_length` that any of `devices` holds, ascending."""
    index_map = sharding.devices_indices_map((batch_length,))
    held = set(devices)
    parts = [
        np.arange(*_batch_slice(index).indices(batch_length), dtype=np.int64)
        for device, index in index_map.items()
        if device in held
    ]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)


def _batch_slice(index: tuple[slice, ...] | None) -> slice:
    # No index means the device holds the whole array.
    return index[0] if index else slice(None)
