"""Meshes from `jax.make_mesh` (explicit axes) and from `Mesh(...)` (auto axes) feed a jitted
training step: its loss and gradient on the sharded batches equal those on the unsharded ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from loadax import Batcher, DataLoader, RangeDataset

DEVICES = jax.device_count()
BATCH = 2 * DEVICES
STEPS = 3


def record(index: int) -> dict[str, Any]:
    features = np.arange(3, dtype=np.float32) + index
    return {"x": features, "y": np.float32(index % 5), "label": np.int32(index % 4)}


RECORDS = RangeDataset(0, BATCH * STEPS).map(record)


def loss(weights: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """A mean over the batch whose gradient contracts the batch dimension (x.T @ error)."""
    error = batch["x"] @ weights - batch["y"]
    return jnp.mean(error**2) + jnp.mean(jax.nn.one_hot(batch["label"], 4) * weights[0])


step = jax.jit(jax.value_and_grad(loss))


def loader(mesh: Mesh | None, depth: int | None) -> Iterator[Any]:
    builder = DataLoader(Batcher()).batch_size(BATCH).shuffle(seed=3)
    if mesh is not None:
        builder = builder.shard(mesh, "data")
    if depth is not None:
        builder = builder.device_prefetch(depth)
    return iter(builder.build(RECORDS))


def expected() -> list[tuple[dict[str, np.ndarray], float, np.ndarray]]:
    """Each step's unsharded batch, loss and gradient, computed on one device."""
    weights = jnp.arange(3, dtype=jnp.float32) / 4
    results = []
    for batch in loader(None, None):
        value, gradient = step(weights, batch)
        results.append((batch, float(value), np.asarray(gradient)))
    return results


def check_steps(batches: Iterator[Any], weights: jax.Array, mesh: Mesh, explicit: bool) -> None:
    """Every batch: the unsharded one's values, split over "data", typed as the mesh says,
    and the same loss and gradient from the jitted step."""
    steps = 0
    for batch, (want, want_loss, want_gradient) in zip(batches, expected(), strict=True):
        for name, leaf in batch.items():
            assert isinstance(leaf, jax.Array)
            np.testing.assert_array_equal(np.asarray(leaf), want[name])
            assert leaf.sharding == NamedSharding(mesh, PartitionSpec("data"))
            typed = jax.typeof(leaf).sharding.spec
            assert typed[0] == ("data" if explicit else None), name
        value, gradient = step(weights, batch)
        np.testing.assert_allclose(float(value), want_loss, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gradient), want_gradient, rtol=1e-6)
        steps += 1
    assert steps == STEPS


def explicit_mesh() -> Mesh:
    mesh = jax.make_mesh((DEVICES,), ("data",))
    assert mesh.axis_types == (AxisType.Explicit,), "jax.make_mesh's default changed"
    return mesh


@pytest.mark.parametrize("depth", [0, 2])
def test_a_jitted_step_under_set_mesh_of_a_make_mesh_matches_the_unsharded_batches(
    depth: int,
) -> None:
    mesh = explicit_mesh()
    with jax.set_mesh(mesh):
        weights = jnp.arange(3, dtype=jnp.float32) / 4  # replicated over the mesh
        check_steps(loader(mesh, depth), weights, mesh, explicit=True)


def test_a_jitted_step_with_weights_placed_on_a_make_mesh_matches_the_unsharded_batches() -> None:
    mesh = explicit_mesh()
    weights = jax.device_put(
        jnp.arange(3, dtype=jnp.float32) / 4, NamedSharding(mesh, PartitionSpec())
    )
    check_steps(loader(mesh, 2), weights, mesh, explicit=True)


@pytest.mark.parametrize(
    "make_mesh",
    [
        lambda: Mesh(np.array(jax.devices()), ("data",)),
        lambda: jax.make_mesh((DEVICES,), ("data",), (AxisType.Auto,)),
    ],
    ids=["Mesh", "make_mesh-auto"],
)
def test_a_jitted_step_on_an_auto_mesh_matches_the_unsharded_batches(
    make_mesh: Callable[[], Mesh],
) -> None:
    mesh = make_mesh()
    weights = jnp.arange(3, dtype=jnp.float32) / 4  # on one device: the compiler moves it
    check_steps(loader(mesh, 2), weights, mesh, explicit=False)


def test_unsharded_batches_join_a_step_on_the_set_mesh() -> None:
    mesh = explicit_mesh()
    with jax.set_mesh(mesh):
        weights = jnp.arange(3, dtype=jnp.float32) / 4
        for batch, (want, want_loss, _) in zip(loader(None, 2), expected(), strict=True):
            value, _ = step(weights, batch)  # refused if the batch is committed to a device
            np.testing.assert_allclose(float(value), want_loss, rtol=1e-6)
            np.testing.assert_array_equal(np.asarray(batch["x"]), want["x"])
