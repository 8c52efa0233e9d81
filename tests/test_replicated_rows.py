"""Replicated rows: the JAX processes of one job that own the same rows (a data axis held by a
device of every process) ask real workers for the same batches, and each batch is computed once
on the fleet; every process still gets the local loader's global batches, byte for byte."""

from __future__ import annotations

import json
import pathlib
import urllib.request

from multihost_replicated_check import EPOCHS, RECORDS, SIDE
from processes import run_jax_processes
from prometheus_client.parser import text_string_to_metric_families
from workers import worker_process

CHECK = pathlib.Path(__file__).parent / "multihost_replicated_check.py"
IMAGES = f"""
[pipelines.images]
factory = "pipelines:images"
args = {{ records = {RECORDS}, side = {SIDE} }}
"""
STEPS = EPOCHS * RECORDS // 8
# No proxy from the environment between the test and the loopback exporter.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def share_counts(metrics: str) -> dict[str, float]:
    """A worker's `loadax_worker_share_*` counters at http://`metrics`/metrics, by name."""
    with _HTTP.open(f"http://{metrics}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        sample.name.removeprefix("loadax_worker_share_"): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("loadax_worker_share_")
    }


def test_processes_that_own_the_same_rows_share_one_computation_of_each_batch(
    tmp_path: pathlib.Path,
) -> None:
    # One worker: with several, load wins over affinity (`loadax.client.member_choice`), so a
    # worker slower for a moment may have a process's request and compute a batch again.
    with worker_process(tmp_path, IMAGES, args=["--metrics", "127.0.0.1:0"]) as worker:
        outputs = run_jax_processes(CHECK, 2, 2, f"--targets={worker.address('grpc')}")
        counts = share_counts(str(worker.metrics))
    told = [json.loads(line) for line in printed(outputs, "replies ")]
    computed, shared = counts["misses_total"], counts["hits_total"] + counts["coalesced_total"]
    assert (computed, shared) == (STEPS, STEPS), (counts, told)
    # Each process was told how its replies came; together, what the workers counted.
    assert sum(each["computed"] for each in told) == STEPS, told
    assert sum(each["coalesced"] + each["cached"] for each in told) == STEPS, told
    # They sit together on the ring of workers, so that with a fleet wider than their arcs
    # they still ask the same workers.
    first, second = printed(outputs, "seat ")
    assert first == second


def printed(outputs: list[str], prefix: str) -> list[str]:
    """What each process printed after `prefix`, once."""
    found = [[line for line in out.splitlines() if line.startswith(prefix)] for out in outputs]
    assert all(len(lines) == 1 for lines in found), outputs
    return [lines[0].removeprefix(prefix) for lines in found]
