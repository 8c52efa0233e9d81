"""R1 with the trainer's own cores: W2's images (full scale) from the local loader (2 threads), from
one `loadax-worker` on loopback (ZeroMQ, `--worker-threads`, default 1: a sidecar that leaves the
trainer one of this machine's 2 cores), and from that worker with `local_members("auto")` beside
it, in turn, each run in a process of its own, forward in one round and reversed in the next. A
rate is steady state, as BENCHMARKS.md reports throughput: the images after the first batch / the
wall time from the first batch to the last of one epoch; the time to the first batch (from
creating the iterator) is reported beside it. The loader's build (the worker's handshake, the local
members' identity) comes before both.
The worker is on the trainer's host: "auto" gives the local members the cores its loading threads
leave and uses it beside them; a worker whose threads take every core shares the trainer's, and is
passed over while the members hold them all, their fallback (`loadax.client.spare_cores`,
`loadax.client.host_cores`). After the timed rounds, one more pass of each hashes every batch
(XXH3 of each array's bytes): the three must agree. Beside each rate, the CPU seconds the
trainer's process and the worker spent on the epoch; of the mixed run, what "auto" chose when and
the requests each member answered. The section goes into SIZING.md (and RESULTS.md's copy).

    .venv/bin/python benchmarks/r1_local_members.py --rounds 3
    .venv/bin/python benchmarks/r1_local_members.py --worker-threads 2 --out /tmp/r1.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_pipelines
import jax
import numpy as np
import xxhash
from fleet_sim import RESULTS, write_section
from local_worker import worker
from profile_remote import config, process_cpu, r1_data
from r4_autoscale import SIZING

from loadax import DataLoader
from loadax.client import RemoteDataLoader, RemoteLoader
from loadax.execution.autotune import usable_cores

TITLE = "R1 with local members"
BATCH, SEED = 64, 0
SYSTEMS = ("local (2 threads)", "remote (1 worker)", 'remote + local_members("auto")')


def loader(system: str, address: str) -> Any:
    pipeline = bench_pipelines.w2(str(r1_data()))
    if system == SYSTEMS[0]:
        local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(2)
        return local.build(pipeline.dataset)
    remote = RemoteDataLoader([address], pipeline="p").batch_size(BATCH).shuffle(seed=SEED)
    if system == SYSTEMS[2]:
        remote = remote.local_members("auto", pipeline=pipeline)
    return remote.build()


class Choices(logging.Handler):
    """What `local_members("auto")` chose, and when the same-host worker was passed over or used
    again, each with the batches the loop had taken by then."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.taken = 0
        self.chosen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("local members' cores: "):
            cores = message.removeprefix("local members' cores: ").split(" (")[0]
            self.chosen.append(f"{cores} at batch {self.taken + 1}")
        event = getattr(record, "event", "")
        if event in ("same_host_passed_over", "same_host_used"):
            said = "passed over" if event == "same_host_passed_over" else "used again"
            self.chosen.append(f"the worker {said} at batch {self.taken + 1}")


def one(system: str, address: str, hashed: bool) -> dict[str, Any]:
    """One epoch of `system`: its rate, or (`hashed`) each batch's digest; the requests each
    member answered and what "auto" chose when."""
    choices = Choices()
    logger = logging.getLogger("loadax.client")
    logger.addHandler(choices)
    logger.setLevel(logging.INFO)
    built = loader(system, address)
    digests, images, first = [], 0, 0.0
    started, cpu = time.perf_counter(), time.process_time()
    with iter(built) as batches:
        for batch in batches:
            choices.taken += 1
            if choices.taken == 1:
                first = time.perf_counter()
            else:
                images += len(batch["label"])
            if hashed:
                leaves = jax.tree.leaves(batch)
                digests.append(
                    "".join(xxhash.xxh3_64_hexdigest(np.ascontiguousarray(x).data) for x in leaves)
                )
    ended, cpu = time.perf_counter(), time.process_time() - cpu
    served = built.stats().workers if isinstance(built, RemoteLoader) else {}
    members = {name: served[name].requests for name in sorted(served)}
    built.close()
    return {
        "rate": images / (ended - first),
        "first": first - started,
        "cpu": cpu,
        "digests": digests,
        "members": members,
        "chosen": choices.chosen,
    }


def in_process(system: str, address: str, hashed: bool) -> dict[str, Any]:
    """`one` in a process of its own."""
    command = [sys.executable, __file__, "--one", system, "--address", address]
    done = subprocess.run(
        [*command, *(["--hashed"] if hashed else [])],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--worker-threads", type=int, default=1, help="the worker's loading threads (default 1)"
    )
    parser.add_argument(
        "--out", type=Path, default=SIZING, help="the section's file (SIZING.md: RESULTS.md too)"
    )
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--hashed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.address, args.hashed)))
        return 0
    started, load = time.monotonic(), os.getloadavg()[0]
    niceness = f" (run at nice {os.nice(0)})" if os.nice(0) else ""
    rates: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    cpus: dict[str, list[float]] = {system: [] for system in SYSTEMS}  # trainer + worker
    firsts: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    members: dict[str, int] = {}
    chosen: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="loadax-r1-"))
    threads, cores = args.worker_threads, usable_cores()
    with worker(config(folder, "R1", 0, "zmq", threads), "zmq") as served:
        for round_ in range(args.rounds):
            # Forward, then reversed: a run right after the remote one was slower (the cause is
            # not known; the worker's own CPU meanwhile is 0.03 s), and in one order the mixed
            # run always came right after it: 0.76-0.85x the local loader in 5-round runs, and
            # 0.93-0.97x with the two swapped. Reversed, the local loader comes after it.
            for system in SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]:
                worker_cpu = process_cpu(served.pid)
                result = in_process(system, served.address, hashed=False)
                rates[system].append(result["rate"])
                firsts[system].append(result["first"])
                cpus[system].append(result["cpu"] + process_cpu(served.pid) - worker_cpu)
                if system == SYSTEMS[2]:
                    members, chosen = result["members"], result["chosen"]
                print(f"round {round_ + 1}: {system}: {result['rate']:,.0f} img/s", flush=True)
        digests = {
            system: in_process(system, served.address, hashed=True)["digests"] for system in SYSTEMS
        }
    shutil.rmtree(folder)
    medians = {system: statistics.median(values) for system, values in rates.items()}
    best_alone = max(medians[SYSTEMS[0]], medians[SYSTEMS[1]])
    same = all(digests[system] == digests[SYSTEMS[0]] for system in SYSTEMS)
    lines = [
        f"`python benchmarks/r1_local_members.py --rounds {args.rounds}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{time.monotonic() - started:.0f} s; 2 cores shared with other sessions{niceness}, "
        "load average "
        f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end): W2 at full scale (4,096 "
        f"images, batch {BATCH}), one epoch per run, each in its own process, systems in turn "
        "within each round, forward then reversed (A B C, C B A); the worker "
        f"(ZeroMQ, {threads} thread{'s' if threads > 1 else ''}) on the same machine. Target: "
        "local members + 1 worker >= the better of local-only and remote-only, identical "
        "batches.",
        "",
        "| system | img/s after the first batch (median) | each round | first batch, ms "
        "(median) | CPU s per epoch, trainer + worker (median) | ÷ the better alone |",
        "|---|---|---|---|---|---|",
    ]
    for system, values in rates.items():
        lines.append(
            f"| {system} | {medians[system]:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} "
            f"| {statistics.median(firsts[system]) * 1000:.0f} "
            f"| {statistics.median(cpus[system]):.1f} | {medians[system] / best_alone:.2f} |"
        )
    paired = [
        mixed / max(local, remote) for local, remote, mixed in zip(*rates.values(), strict=True)
    ]
    verdict = "met" if medians[SYSTEMS[2]] >= best_alone and same else "missed"
    lines += [
        "",
        f"Batches identical in all three: {'yes' if same else 'NO'} "
        f"({len(digests[SYSTEMS[0]])} batches, XXH3 of every array). Requests each member "
        f"answered in the last mixed run: "
        f"{', '.join(f'{name} {count}' for name, count in members.items())}. Target {verdict}.",
        "",
        "Mixed ÷ the better alone, round by round: "
        f'{", ".join(f"{ratio:.2f}" for ratio in paired)}. What "auto" chose in the last '
        f"mixed run: {', '.join(chosen) or 'nothing'} (cores of one local member, whose threads "
        "split each batch as a worker's do, go on to the next batch's records as the local "
        "loader's do and answer a batch on the thread that finished it: every core that workers "
        "on this host leave, from the start when no worker on another host serves the loader, "
        "else one per 8 batches after "
        "a 4-batch baseline of the loop's own step; one given back when that step's median "
        "grows by more than 5 % of the whole step in two windows running).",
        "",
        "The worker is on the trainer's host (found at the handshake, as for shared memory): a "
        "batch it makes costs the host more CPU than a local member's (made in another process, "
        "written into the trainer's memory file and checksummed there and here; a local "
        "member's is made and used in the trainer's process: not checksummed, and handed over "
        "without being encoded), but under a Python lock of its own. "
        + (
            f"Its {threads} loading thread{'s' if threads > 1 else ''} leave"
            f"{'' if threads > 1 else 's'} the trainer {cores - threads} of this machine's "
            f"{cores} cores: the local member takes {'those' if cores - threads > 1 else 'that'}"
            " and the worker is used beside it (`loadax.client.spare_cores`)."
            if threads < cores
            else f"Its {threads} loading threads take every one of this machine's {cores} "
            "cores: it shares the trainer's, so the local member takes them all from the start "
            "and the worker is passed over: their fallback, used again if the loop's step slows "
            "or the member fails (`loadax.client.host_cores`)."
        ),
    ]
    print("\n".join(lines))
    for path in (args.out, RESULTS) if args.out == SIZING else (args.out,):
        write_section(path, TITLE, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
