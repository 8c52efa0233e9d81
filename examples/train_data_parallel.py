"""Data-parallel training of a tiny linear model over local JAX processes, fed by loadax.

It launches the processes and stops them all if one fails; each trains and checks exact resume.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from demo_pipeline import FEATURES, regression_examples, true_weights
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from local_processes import (
    JaxJob,
    launch_or_train,
    non_negative_float,
    positive_int,
    say,
)

from loadax import Batcher, DataLoader, Loader
from loadax.delivery.meshes import ddp_sharding

RECORDS = 512
SHUFFLE_SEED = 0
LEARNING_RATE = 0.1
LOG_EVERY = 8
LOADER_WORKERS = 2
DEVICE_PREFETCH = 2
INIT_TIMEOUT_S = 60

Params = dict[str, jax.Array]


def build_loader(mesh: Mesh, global_batch: int, epochs: int) -> Loader[Any]:
    dataset = regression_examples(RECORDS)
    return (
        DataLoader(Batcher())
        .batch_size(global_batch)
        .shuffle(seed=SHUFFLE_SEED)
        .num_epochs(epochs)
        .drop_remainder()
        .workers(LOADER_WORKERS)
        .shard(mesh, "data")
        .device_prefetch(DEVICE_PREFETCH)
        .build(dataset)
    )


def loss_fn(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    prediction = batch["x"] @ params["w"] + params["b"]
    return jnp.mean((prediction - batch["y"]) ** 2)


@jax.jit
def train_step(params: Params, batch: dict[str, jax.Array]) -> tuple[Params, jax.Array]:
    # The batch is split over "data" and the params replicated: XLA all-reduces the gradients.
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    new_params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return new_params, loss


def replicated_zeros(mesh: Mesh) -> Params:
    """Initial parameters, a whole copy on every device of the mesh."""
    sharding = NamedSharding(mesh, PartitionSpec())  # type: ignore[no-untyped-call]  # no stub
    initial = {"w": np.zeros(FEATURES, np.float32), "b": np.zeros((), np.float32)}
    return {name: replicate(value, sharding) for name, value in initial.items()}


def replicate(value: npt.NDArray[np.float32], sharding: NamedSharding) -> jax.Array:
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def gathered(batch: Any) -> list[npt.NDArray[Any]]:
    """The leaves of a global batch, whole, on every process (a collective: all must call it)."""
    return [
        np.asarray(leaf)
        for leaf in jax.tree.leaves(multihost_utils.process_allgather(batch, tiled=True))
    ]


def resumes_identically(loader: Loader[Any], state: dict[str, Any], expected: list[Any]) -> bool:
    """Whether a fresh iterator restored from `state` yields `expected`, on every process."""
    with iter(loader) as resumed:
        resumed.set_state(state)
        actual = list(resumed)
    same = len(actual) == len(expected)
    if same:  # every process has the same count, so all of them take part in the collectives
        for want, got in zip(expected, actual, strict=True):
            pairs = zip(gathered(want), gathered(got), strict=True)
            same = all(np.array_equal(a, b) for a, b in pairs) and same
    verdicts = multihost_utils.process_allgather(np.array(same))
    return bool(np.all(verdicts))


def train(args: argparse.Namespace) -> int:
    jax.distributed.initialize(
        args.coordinator,
        num_processes=args.processes,
        process_id=args.process_id,
        initialization_timeout=INIT_TIMEOUT_S,
    )
    is_first = jax.process_index() == 0

    def report(line: str) -> None:
        if is_first:
            print(line, flush=True)

    mesh, _ = ddp_sharding()
    loader = build_loader(mesh, args.batch_size, args.epochs)
    steps = len(loader)
    if steps < 2:
        raise ValueError(
            f"{RECORDS} records in global batches of {args.batch_size} make {steps} steps; "
            "checkpointing halfway needs at least 2"
        )
    save_at = steps // 2
    report(
        f"{jax.process_count()} processes, {jax.device_count()} devices, "
        f"global batch {args.batch_size}, {steps} steps"
    )
    params = replicated_zeros(mesh)
    checkpoint = ""
    after_checkpoint: list[Any] = []
    loss = jnp.zeros(())
    with iter(loader) as iterator:
        for step, batch in enumerate(iterator):
            if step >= save_at:
                after_checkpoint.append(batch)
            if step == args.crash_at_step and jax.process_index() == jax.process_count() - 1:
                raise RuntimeError(f"injected failure at step {step}")
            params, loss = train_step(params, batch)
            if step % LOG_EVERY == 0:
                report(f"step {step}: loss {float(loss):.6f}")
            if step + 1 == save_at:
                checkpoint = json.dumps(iterator.get_state())  # what a training job would save
                report(f"checkpoint after {save_at} steps: {checkpoint}")
    distance = float(np.linalg.norm(np.asarray(params["w"]) - true_weights()))
    report(f"final loss: {float(loss):.6f}")
    report(f"weight distance: {distance:.6f}")

    identical = resumes_identically(loader, json.loads(checkpoint), after_checkpoint)
    verdict = "identical" if identical else "MISMATCH"
    report(f"resume check: {verdict} ({len(after_checkpoint)} global batches from step {save_at})")
    return 0 if identical else 1


def child_command(args: argparse.Namespace, index: int, coordinator: str) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), f"--process-id={index}"]
    command += [f"--coordinator={coordinator}", f"--processes={args.processes}"]
    command += [f"--batch-size={args.batch_size}", f"--epochs={args.epochs}"]
    if args.crash_at_step is not None:
        command.append(f"--crash-at-step={args.crash_at_step}")
    return command


def relay(index: int, line: str) -> None:
    """Print a line of a process's output, prefixed by its process id."""
    say(f"[{index}] {line}")


def launch(args: argparse.Namespace) -> int:
    """Start every process, wait for all of them, and stop the rest as soon as one fails."""
    command = functools.partial(child_command, args)
    with JaxJob(command, args.processes, args.devices_per_process, relay) as job:
        for index, child in enumerate(job.children):
            say(f"[launcher] started process {index} (pid {child.pid})")
        failure = job.wait(args.timeout)
    if failure is not None:
        say(f"[launcher] {failure}; stopped every process")
        return 1
    say(f"[launcher] all {args.processes} processes finished")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=positive_int, default=2)
    parser.add_argument("--devices-per-process", type=positive_int, default=2)
    parser.add_argument("--batch-size", type=positive_int, default=32, help="global batch size")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument(
        "--timeout", type=non_negative_float, default=120.0, help="seconds for the whole run"
    )
    parser.add_argument(
        "--crash-at-step",
        type=int,
        help="fault injection: the last process raises at this step (the launcher stops them all)",
    )
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)  # internal
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if (args.process_id is None) != (args.coordinator is None):
        parser.error("--process-id and --coordinator are given together (by the launcher)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return launch_or_train(parse_args(argv), launch, train)


if __name__ == "__main__":
    sys.exit(main())
