"""Data-parallel training of a tiny linear model over local JAX processes, fed by loadax.

It launches the processes and stops them all if one fails; each trains and checks exact resume.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO, Any, NoReturn, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loadax import Batcher, DataLoader, Loader, RangeDataset
from loadax.sharding_utilities import ddp_sharding

FEATURES = 8
RECORDS = 512
NOISE = 0.01
TRUE_W_SEED = 1234
SHUFFLE_SEED = 0
LEARNING_RATE = 0.1
LOG_EVERY = 8
LOADER_WORKERS = 2
DEVICE_PREFETCH = 2
INIT_TIMEOUT_S = 60
PRINT_LOCK = threading.Lock()

Params = dict[str, jax.Array]
ExitQueue = queue.Queue[tuple[int, int]]  # (process id, exit code)


class Example(TypedDict):
    x: npt.NDArray[np.float32]
    y: np.float32


def true_weights() -> npt.NDArray[np.float32]:
    return np.random.default_rng(TRUE_W_SEED).normal(size=FEATURES).astype(np.float32)


def make_example(index: int) -> Example:
    """Example `index`: its own features and a noisy linear target, the same on every process."""
    rng = np.random.default_rng(index)
    x = rng.normal(size=FEATURES).astype(np.float32)
    y = np.float32(x @ true_weights() + NOISE * rng.normal())
    return {"x": x, "y": y}


def build_loader(mesh: Mesh, global_batch: int, epochs: int) -> Loader[Any]:
    dataset = RangeDataset(0, RECORDS).map(make_example)
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


def run_child(args: argparse.Namespace) -> NoReturn:
    # The launcher holds our stdin: when it goes away, even killed outright, so do we.
    threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    try:
        code = train(args)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: jax.distributed's shutdown barrier would wait for failed peers.
    os._exit(code)


def exit_when_stdin_closes() -> None:
    sys.stdin.buffer.read()
    os._exit(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def relay(index: int, stream: IO[str]) -> None:
    """Print one of a child's output streams line by line, prefixed by its process id."""
    for line in stream:
        say(f"[{index}] {line.rstrip()}")


def report_exit(index: int, child: subprocess.Popen[str], exits: ExitQueue) -> None:
    exits.put((index, child.wait()))


def started(target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def say(line: str) -> None:
    with PRINT_LOCK:  # one line at a time from the relay threads
        print(line, flush=True)


def child_command(args: argparse.Namespace, index: int, coordinator: str) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), f"--process-id={index}"]
    command += [f"--coordinator={coordinator}", f"--processes={args.processes}"]
    command += [f"--batch-size={args.batch_size}", f"--epochs={args.epochs}"]
    if args.crash_at_step is not None:
        command.append(f"--crash-at-step={args.crash_at_step}")
    return command


def launch(args: argparse.Namespace) -> int:
    """Start every process, wait for all of them, and stop the rest as soon as one fails."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices_per_process}",
    }
    exits: ExitQueue = queue.Queue()
    children: list[subprocess.Popen[str]] = []
    threads: list[threading.Thread] = []  # relays and exit waiters
    deadline = time.monotonic() + args.timeout
    failed: list[str] = []
    try:
        for index in range(args.processes):
            child = subprocess.Popen(
                child_command(args, index, coordinator),
                env=env,
                stdin=subprocess.PIPE,
                # Two pipes: C++ logging on stderr must not split the lines of the report.
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            children.append(child)
            say(f"[launcher] started process {index} (pid {child.pid})")
            for stream in (child.stdout, child.stderr):
                if stream is None:  # always a pipe: see Popen above
                    raise RuntimeError(f"process {index} has no output pipe")
                threads.append(started(relay, index, stream))
            threads.append(started(report_exit, index, child, exits))
        for _ in children:
            try:
                index, code = exits.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                failed.append(f"timed out after {args.timeout:g} s")
                break
            if code != 0:
                failed.append(f"process {index} exited with code {code}")
                break
    finally:
        for child in children:  # on success they have all exited; otherwise none may outlive us
            if child.poll() is None:
                child.kill()
            child.wait()
        for thread in threads:
            thread.join()
    if failed:
        say(f"[launcher] {failed[0]}; stopped every process")
        return 1
    say(f"[launcher] all {args.processes} processes finished")
    return 0


def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through launch(), which kills the children


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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
    args = parse_args(argv)
    if args.process_id is not None:
        return run_child(args)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
