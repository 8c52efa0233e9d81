"""The loaders of one job's JAX processes: seated evenly on the ring of workers (`job_seat`),
those that own the same rows together, and bound to one pipeline identity: the JAX processes
that share a loader's mesh agree on the identity their loaders bound to before the first batch,
so that one global batch never holds rows of two versions of the pipeline's code.

Each process publishes what it bound to in `jax.distributed`'s key-value store, then reads what
every other process of the mesh published. The processes of one job build their loaders in the
same order (the same program runs in each), so the n-th loader of a pipeline in one process is
the n-th in every other.
"""

from __future__ import annotations

import collections
import json
import uuid
from collections.abc import Sequence

import jax
from jax._src import distributed  # the key-value store `jax.distributed.initialize` connects
from jax.sharding import Mesh

from loadax.client.member import Identity
from loadax.client.subset import Seat
from loadax.delivery.sharding import DataAxis, ShardingStrategy, rows_for_devices

_KEY_PREFIX = "loadax/identity"
_built: collections.Counter[str] = collections.Counter()  # loaders agreed on, per pipeline


def mesh_processes(mesh: Mesh | None) -> list[int]:
    """The JAX processes whose devices are in `mesh`, sorted (none without a mesh)."""
    if mesh is None:
        return []
    return sorted({int(device.process_index) for device in mesh.devices.flat})


def row_groups(mesh: Mesh | None, data_axis: DataAxis | None) -> list[list[int]]:
    """The JAX processes of `mesh` (sorted) grouped by the rows of a global batch they load, in
    the order of their first processes: those whose devices hold the same data shards (the data
    axis replicated across them, as a model axis across processes makes it) are one group."""
    if mesh is None:
        return []
    strategy = ShardingStrategy(mesh, data_axis)
    shards = strategy.num_data_shards
    groups: dict[bytes, list[int]] = {}
    for process in mesh_processes(mesh):
        devices = [device for device in mesh.devices.flat if device.process_index == process]
        rows = rows_for_devices(strategy.sharding, shards, devices)
        groups.setdefault(rows.tobytes(), []).append(process)
    return list(groups.values())


def job_seat(pipeline: str, groups: Sequence[Sequence[int]]) -> Seat:
    """Where this process's loader of `pipeline` sits on the ring of workers: in its group of
    `groups` (`row_groups`), the groups seated evenly (turned by the job's coordinator address,
    so that jobs are not seated alike); alone, anywhere. Processes that own the same rows sit
    together: their requests, of one digest, go to the same arc of workers, where they meet
    (`loadax.client.affinity`) and are computed once."""
    coordinator = distributed.global_state.coordinator_address
    alone = Seat.of(0, 1, uuid.uuid4().hex)
    if sum(map(len, groups)) < 2 or coordinator is None:
        return alone  # without asking JAX, whose backend would start for nothing
    this = jax.process_index()
    mine = [index for index, group in enumerate(groups) if this in group]
    if not mine:
        return alone
    return Seat.of(mine[0], len(groups), f"{pipeline}@{coordinator}")


def agree(
    pipeline: str,
    identity: Identity,
    targets: Sequence[str],
    processes: Sequence[int],
    timeout: float,
) -> None:
    """Check that every one of `processes` (this one among them) bound its loader of `pipeline`
    to `identity`; a ValueError naming each process's fingerprint and targets if not, or if one
    does not say within `timeout` seconds. Nothing to do for a mesh of one process."""
    client = distributed.global_state.client
    if len(processes) < 2 or client is None:
        return
    this = jax.process_index()
    group = "-".join(map(str, processes))
    key = f"{_KEY_PREFIX}/{pipeline}/{group}/{_built[pipeline]}"
    _built[pipeline] += 1
    said = {
        "fingerprint": identity.fingerprint,
        "identity": str(identity),
        "targets": list(targets),
    }
    client.key_value_set(f"{key}/{this}", json.dumps(said))
    heard: dict[int, dict[str, object]] = {}
    deadline_ms = max(int(timeout * 1000), 1)
    for process in processes:
        try:
            heard[process] = json.loads(
                client.blocking_key_value_get(f"{key}/{process}", deadline_ms)
            )
        except Exception as error:  # jaxlib raises its own error type at the deadline
            raise ValueError(
                f"JAX process {process} did not say which pipeline identity its loader of "
                f"{pipeline!r} bound to within {timeout:g} s (did its build fail?): {error}"
            ) from None
    if len({str(each["fingerprint"]) for each in heard.values()}) > 1:
        raise ValueError(
            f"the JAX processes of this job bound their loaders of pipeline {pipeline!r} to "
            "different pipeline identities, so one global batch would mix two versions of its "
            "code: "
            + "; ".join(
                f"process {process}: {each['identity']} from {each['targets']}"
                for process, each in sorted(heard.items())
            )
            + ". Point every process at workers running the same code, or pin one with "
            "RemoteDataLoader(...).fingerprint(...)."
        )
