"""Ready-made meshes for the two common layouts, for any number of processes and devices."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

ShardingPreset = tuple[Mesh, tuple[str, ...]]


def ddp_sharding() -> ShardingPreset:
    """Data parallel: one "data" axis over every device, each device gets its own rows.

    >>> import jax
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.delivery.meshes import ddp_sharding
    >>> mesh, data_axes = ddp_sharding()
    >>> data_axes, mesh.size == jax.device_count()
    (('data',), True)
    >>> loader = DataLoader(Batcher()).batch_size(jax.device_count()).shard(mesh, data_axes)
    >>> batch = next(iter(loader.device_prefetch().build(RangeDataset(0, 64))))
    >>> batch.sharding.spec == jax.sharding.PartitionSpec("data")
    True
    """
    return Mesh(devices_by_process().reshape(-1), ("data",)), ("data",)


def fsdp_sharding() -> ShardingPreset:
    """A ("data", "model") mesh: each process is one data shard; its devices form the model axis.

    Parameters are sharded over "model"; the devices of one process hold the same rows of data.

    >>> import jax
    >>> from loadax.delivery.meshes import fsdp_sharding
    >>> mesh, data_axes = fsdp_sharding()
    >>> mesh.axis_names, data_axes, mesh.shape["data"] == jax.process_count()
    (('data', 'model'), ('data', 'model'), True)
    """
    return Mesh(devices_by_process(), ("data", "model")), ("data", "model")


def devices_by_process() -> np.ndarray[Any, Any]:
    """All devices as a (process, local device) array, each row sorted by device id.

    >>> import jax
    >>> from loadax.delivery.meshes import devices_by_process
    >>> devices_by_process().shape == (jax.process_count(), jax.local_device_count())
    True
    """
    by_process: defaultdict[int, list[jax.Device]] = defaultdict(list)
    for device in jax.devices():
        by_process[device.process_index].append(device)
    counts = {process: len(devices) for process, devices in by_process.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"processes have different numbers of devices: {counts}")
    rows = [sorted(by_process[process], key=lambda device: device.id) for process in sorted(counts)]
    grid = np.empty((len(rows), len(rows[0])), dtype=object)
    for process, devices in enumerate(rows):
        grid[process, :] = devices
    return grid
