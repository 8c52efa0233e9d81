"""Train, SIGKILL, resume: the resumed loss curve is the uninterrupted one, bit for bit.

Two loadax workers serve a synthetic regression pipeline (or those of --workers are used). A tiny
MLP trains data-parallel with optax on two local JAX processes fed by a RemoteDataLoader, and
Orbax checkpoints the model, the optimizer and the loader together every few steps. The
training runs once undisturbed; then again, killed with SIGKILL after a checkpoint; then it
restarts from the last checkpoint. Exit status 0 when every loss of the killed and the resumed
run equals the undisturbed run's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import jax
import jax.numpy as jnp
import optax  # type: ignore[import-untyped]
import orbax.checkpoint as ocp  # type: ignore[import-untyped]
from demo_pipeline import FEATURES
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from local_processes import (
    JaxJob,
    launch_or_train,
    non_negative_float,
    positive_int,
    say,
    start_worker,
    stop_worker,
)

from loadax.client import RemoteDataLoader
from loadax.delivery.meshes import ddp_sharding
from loadax.state.checkpoint import LoaderRestore, LoaderSave

PIPELINE = "regression"
FACTORY = "demo_pipeline:regression"
RECORDS = 512
LOCAL_WORKERS = 2
PROCESSES = 2
HIDDEN = 16
LEARNING_RATE = 0.05
INIT_SEED = 0
SHUFFLE_SEED = 0
REMOTE_PREFETCH = 8
DEVICE_PREFETCH = 2
INIT_TIMEOUT_S = 60
OUTPUT_TAIL = 20  # lines of each trainer's output shown when a run fails

Params = dict[str, jax.Array]
Batch = dict[str, jax.Array]
OPTIMIZER = optax.adam(LEARNING_RATE)


class TrainState(TypedDict):
    params: Params
    opt_state: optax.OptState


# The trainer processes.


def init_params(key: jax.Array) -> Params:
    hidden_key, out_key = jax.random.split(key)
    return {
        "w1": jax.random.normal(hidden_key, (FEATURES, HIDDEN)) / math.sqrt(FEATURES),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(out_key, (HIDDEN,)) / math.sqrt(HIDDEN),
        "b2": jnp.zeros(()),
    }


def loss_fn(params: Params, batch: Batch) -> jax.Array:
    hidden = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    prediction = hidden @ params["w2"] + params["b2"]
    return jnp.mean((prediction - batch["y"]) ** 2)


@jax.jit
def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, jax.Array]:
    # The batch is split over "data" and the state replicated: XLA all-reduces the gradients.
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
    updates, opt_state = OPTIMIZER.update(grads, state["opt_state"], state["params"])
    params: Params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state}, loss


def initial_state(mesh: Mesh) -> TrainState:
    """The model and optimizer before step 1, a whole copy on every device of the mesh."""

    def init() -> TrainState:
        params = init_params(jax.random.key(INIT_SEED))
        return {"params": params, "opt_state": OPTIMIZER.init(params)}

    replicated = NamedSharding(mesh, PartitionSpec())  # type: ignore[no-untyped-call]  # no stub
    state: TrainState = jax.jit(init, out_shardings=replicated)()
    return state


def emit(event: str, **fields: Any) -> None:
    """Tell the launcher what happened: one JSON line, from process 0 only."""
    if jax.process_index() == 0:
        print(json.dumps({"event": event, **fields}), flush=True)


def train(args: argparse.Namespace) -> int:
    """Train to step `args.steps` from the last checkpoint in `args.checkpoints`, if any."""
    jax.distributed.initialize(
        args.coordinator,
        num_processes=PROCESSES,
        process_id=args.process_id,
        initialization_timeout=INIT_TIMEOUT_S,
    )
    mesh, _ = ddp_sharding()
    loader = (
        RemoteDataLoader(args.workers, pipeline=PIPELINE)
        .batch_size(args.batch_size)
        .shuffle(seed=SHUFFLE_SEED)
        .num_epochs(None)
        .prefetch(REMOTE_PREFETCH)
        .shard(mesh, "data")
        .device_prefetch(DEVICE_PREFETCH)
        .build()
    )
    state = initial_state(mesh)
    every = ocp.checkpoint_managers.FixedIntervalPolicy(args.checkpoint_every)
    options = ocp.CheckpointManagerOptions(save_decision_policy=every)
    with (
        loader,
        ocp.CheckpointManager(args.checkpoints, options=options) as manager,
        iter(loader) as batches,
    ):
        done = manager.latest_step()
        if done is None:
            done = 0
        else:
            restored = manager.restore(
                done,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(state), loader=LoaderRestore(batches)
                ),
            )
            state = restored.state
            emit("restored", step=done)
        for step in range(done + 1, args.steps + 1):
            state, loss = train_step(state, next(batches))
            emit("loss", step=step, loss=float(loss))
            saving = ocp.args.Composite(
                state=ocp.args.StandardSave(state), loader=LoaderSave(batches)
            )
            if manager.save(step, args=saving):  # every `checkpoint_every` steps; asynchronous
                emit("checkpoint", step=step)
            if step == args.pause_after:
                manager.wait_until_finished()
                emit("paused", step=step, committed=manager.latest_step())
                threading.Event().wait()  # until the launcher kills us
    return 0


# The launcher.


class RunFailed(Exception):
    """A run of the trainers that failed: what went wrong, and the end of their output."""

    def __init__(self, name: str, problem: str, output: Mapping[int, Sequence[str]]) -> None:
        tails = [
            f"[{index}] {line}" for index in sorted(output) for line in output[index][-OUTPUT_TAIL:]
        ]
        super().__init__(
            f"{name} run failed: {problem}; the trainers printed:\n" + "\n".join(tails)
        )


class Run:
    """What one run of the trainer processes reported."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.output: dict[int, list[str]] = {index: [] for index in range(PROCESSES)}
        self.losses: dict[int, float] = {}
        self.checkpoints: list[int] = []
        self.restored = 0  # the step it resumed after
        self.committed: int | None = None  # the last checkpoint on disk when it paused
        self.paused = threading.Event()
        self.seconds = 0.0
        self.exit_statuses: list[int] = []

    def add(self, index: int, line: str) -> None:
        """Take one line a trainer printed; process 0's JSON lines are its events."""
        self.output[index].append(line)
        if index != 0 or not line.startswith('{"event"'):
            return
        event = json.loads(line)
        if event["event"] == "loss":
            self.losses[event["step"]] = event["loss"]
        elif event["event"] == "checkpoint":
            self.checkpoints.append(event["step"])
        elif event["event"] == "restored":
            self.restored = event["step"]
        elif event["event"] == "paused":
            self.committed = event["committed"]
            self.paused.set()

    def check_steps(self, first: int, last: int) -> None:
        if sorted(self.losses) != list(range(first, last + 1)):
            problem = f"it reported losses of steps {sorted(self.losses)}, not {first} to {last}"
            raise RunFailed(self.name, problem, self.output)


def trainer_command(
    args: argparse.Namespace,
    targets: Sequence[str],
    checkpoints: Path,
    pause_after: int | None,
    index: int,
    coordinator: str,
) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), f"--process-id={index}"]
    command += [f"--coordinator={coordinator}", f"--checkpoints={checkpoints}"]
    command += [f"--workers={','.join(targets)}", f"--steps={args.steps}"]
    command += [f"--checkpoint-every={args.checkpoint_every}", f"--batch-size={args.batch_size}"]
    if pause_after is not None:
        command.append(f"--pause-after={pause_after}")
    return command


def run_trainers(
    args: argparse.Namespace,
    name: str,
    targets: Sequence[str],
    checkpoints: Path,
    kill_after: int | None = None,
) -> Run:
    """Run the trainers to the last step, or until they pass `kill_after` and are SIGKILLed."""
    run = Run(name)
    command = functools.partial(trainer_command, args, targets, checkpoints, kill_after)
    start = time.monotonic()
    with JaxJob(command, PROCESSES, args.devices_per_process, run.add) as job:
        problem = job.wait(args.timeout, until=run.paused.is_set)
        if problem is None and kill_after is not None:
            if not run.paused.is_set():
                problem = f"the trainers exited before step {kill_after}"
            run.exit_statuses = job.kill()  # SIGKILL: no clean-up, no final checkpoint
    if problem is not None:
        raise RunFailed(name, problem, run.output)
    run.seconds = time.monotonic() - start
    return run


def listed(items: Sequence[object]) -> str:
    return ", ".join(map(str, items)) or "none"


def train_kill_resume(args: argparse.Namespace, targets: Sequence[str], directory: Path) -> bool:
    """Run the three trainings, print the loss curves side by side; whether they match."""
    say(
        f"training: {FEATURES}-{HIDDEN}-1 MLP, adam, {args.steps} steps of global batch "
        f"{args.batch_size} on {PROCESSES} processes x {args.devices_per_process} CPU devices, "
        f"checkpoint every {args.checkpoint_every} steps"
    )
    reference = run_trainers(args, "reference", targets, directory / "reference")
    reference.check_steps(1, args.steps)
    say(
        f"reference run: steps 1-{args.steps} in {reference.seconds:.1f} s, "
        f"checkpoints at steps {listed(reference.checkpoints)}"
    )
    killed = run_trainers(args, "killed", targets, directory / "resumed", args.kill_after)
    killed.check_steps(1, args.kill_after)
    say(
        f"killed run: checkpoints at steps {listed(killed.checkpoints)}, step {killed.committed} "
        f"committed; SIGKILLed both trainers after step {args.kill_after} "
        f"(exit status {listed(killed.exit_statuses)})"
    )
    resumed = run_trainers(args, "resumed", targets, directory / "resumed")
    if resumed.restored != killed.committed:
        problem = f"it restored step {resumed.restored}, not the last checkpoint {killed.committed}"
        raise RunFailed("resumed", problem, resumed.output)
    resumed.check_steps(resumed.restored + 1, args.steps)
    say(
        f"resumed run: restored model, optimizer and loader at step {resumed.restored}, "
        f"trained steps {resumed.restored + 1}-{args.steps} in {resumed.seconds:.1f} s"
    )

    say(f"{'step':>4}  {'reference':>12}  {'killed run':>12}  {'resumed run':>12}")
    for step in range(1, args.steps + 1):
        cells = [reference.losses[step], killed.losses.get(step), resumed.losses.get(step)]
        text = "  ".join(f"{'' if loss is None else f'{loss:.9g}':>12}" for loss in cells)
        same = all(loss in (None, reference.losses[step]) for loss in cells)
        say(f"{step:>4}  {text}{'' if same else '  <- differs'}".rstrip())
    before = all(loss == reference.losses[step] for step, loss in killed.losses.items())
    after = all(loss == reference.losses[step] for step, loss in resumed.losses.items())
    say(f"losses before the kill match: {'yes' if before else 'no'}")
    say(f"resumed loss curve matches: {'yes' if after else 'no'}")
    return before and after


@contextlib.contextmanager
def local_workers(directory: Path) -> Iterator[list[str]]:
    """`LOCAL_WORKERS` workers serving the pipeline on loopback, SIGTERMed at the end; their
    gRPC targets."""
    workers, targets = [], []
    try:
        for index in range(LOCAL_WORKERS):
            home = directory / f"worker{index}"
            home.mkdir()
            worker, ready = start_worker(
                home, PIPELINE, FACTORY, {"records": RECORDS}, log_level="WARNING"
            )
            workers.append(worker)
            targets.append(f"grpc://{ready['grpc']}")
        say(
            f"workers: {len(workers)} loadax-worker processes serve {PIPELINE!r} "
            f"at {listed(targets)}"
        )
        yield targets
    finally:
        statuses = [stop_worker(worker) for worker in workers]
        say(f"workers stopped (exit status {listed(statuses)})")


def launch(args: argparse.Namespace) -> int:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="loadax-train-resume-") as scratch:
        directory = Path(scratch)
        workers: contextlib.AbstractContextManager[list[str]]
        if args.workers is None:
            workers = local_workers(directory)
        else:
            say(f"workers: {listed(args.workers)}")
            workers = contextlib.nullcontext(args.workers)
        try:
            with workers as targets:
                matches = train_kill_resume(args, targets, directory)
        except RunFailed as error:
            say(str(error))
            matches = False
    say(f"wall time: {time.monotonic() - start:.1f} s")
    return 0 if matches else 1


def targets_list(text: str) -> list[str]:
    targets = [target.strip() for target in text.split(",") if target.strip()]
    if not targets:
        raise argparse.ArgumentTypeError(f"expected comma-separated worker addresses, got {text!r}")
    return targets


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--workers",
        type=targets_list,
        metavar="TARGETS",
        help="running workers that serve the 'regression' pipeline (demo_pipeline:regression), "
        "as grpc://host:port,... (default: start 2 on loopback)",
    )
    parser.add_argument("--steps", type=positive_int, default=24)
    parser.add_argument("--checkpoint-every", type=positive_int, default=4, metavar="STEPS")
    parser.add_argument(
        "--kill-after", type=positive_int, default=14, metavar="STEP", help="the step to kill at"
    )
    parser.add_argument("--batch-size", type=positive_int, default=32, help="global batch size")
    parser.add_argument("--devices-per-process", type=positive_int, default=2)
    parser.add_argument(
        "--timeout", type=non_negative_float, default=120.0, help="seconds for each training run"
    )
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)  # internal
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)  # internal
    parser.add_argument("--checkpoints", help=argparse.SUPPRESS)  # internal
    parser.add_argument("--pause-after", type=int, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    is_launcher = args.process_id is None
    if is_launcher and not args.checkpoint_every <= args.kill_after < args.steps:
        parser.error(
            f"--kill-after must be at least --checkpoint-every ({args.checkpoint_every}), so that "
            f"a checkpoint precedes the kill, and less than --steps ({args.steps}); "
            f"got {args.kill_after}"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return launch_or_train(parse_args(argv), launch, train)


if __name__ == "__main__":
    sys.exit(main())
