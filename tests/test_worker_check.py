"""`loadax-worker --check` refuses a pipeline that would fail every request (its probe batch
fails) or break checkpoints and failover (two probes of it differ); it reports the memory budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from workers import worker_env

WORKER_SCRIPT = Path(sys.executable).with_name("loadax-worker")
FACTORIES = '''
"""Pipelines for `loadax-worker --check`: one fit to serve, two not."""

import numpy as np

import loadax


def good(records: int = 16) -> loadax.Pipeline:
    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(lambda i: {"x": np.full(3, i)}), loadax.Batcher()
    )


def ragged(records: int = 16) -> loadax.Pipeline:
    """Record i has i % 3 + 1 values: a batch of them cannot be stacked."""
    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(lambda i: {"x": np.zeros(i % 3 + 1)}),
        loadax.Batcher(),
    )


def noisy(records: int = 16) -> loadax.Pipeline:
    """Draws from np.random without a seed: every load of a step differs."""
    return loadax.Pipeline(
        loadax.RangeDataset(0, records).map(lambda i: {"x": i + np.random.random()}),
        loadax.Batcher(),
    )
'''


def run_check(
    tmp_path: Path, pipelines: tuple[str, ...], *flags: str
) -> subprocess.CompletedProcess[str]:
    """The real `loadax-worker --check` on a config serving `pipelines` of FACTORIES."""
    (tmp_path / "checked.py").write_text(FACTORIES)
    served = "".join(f'[pipelines.{name}]\nfactory = "checked:{name}"\n' for name in pipelines)
    config = tmp_path / "worker.toml"
    config.write_text(f'[server]\ngrpc = "127.0.0.1:0"\npython_path = ["."]\n{served}')
    return subprocess.run(
        [str(WORKER_SCRIPT), "--config", str(config), "--check", *flags],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=120,
        check=False,
    )


def check(tmp_path: Path, *pipelines: str) -> tuple[int, dict[str, Any], str]:
    """`run_check` with --json: its exit status, its report and its stderr."""
    done = run_check(tmp_path, pipelines, "--json")
    return done.returncode, json.loads(done.stdout), done.stderr


def test_a_config_of_good_pipelines_passes_and_reports_the_memory_budget(tmp_path: Path) -> None:
    status, report, stderr = check(tmp_path, "good")
    assert status == 0, stderr
    assert (report["valid"], report["problems"]) == (True, [])
    assert "memory_budget_bytes" in report


@pytest.mark.parametrize(
    ("pipeline", "problem"),
    [
        ("ragged", "pipeline 'ragged': its probe batch (the first rows of step 0, or window 0"),
        ("noisy", "pipeline 'noisy': the pipeline is not deterministic: two builds and probes"),
    ],
)
def test_a_pipeline_unfit_to_serve_fails_the_check(
    tmp_path: Path, pipeline: str, problem: str
) -> None:
    status, report, stderr = check(tmp_path, "good", pipeline)
    assert status == 2, stderr
    assert report["valid"] is False
    assert [found[: len(problem)] for found in report["problems"]] == [problem]
    # The report still lists what the config serves.
    assert [served["name"] for served in report["pipelines"]] == ["good", pipeline]


def test_without_json_the_problems_go_to_stderr(tmp_path: Path) -> None:
    done = run_check(tmp_path, ("noisy",))
    assert done.returncode == 2
    assert done.stdout.startswith("noisy: checked:noisy(**{}) -> 16 records, fingerprint ")
    config = tmp_path / "worker.toml"
    assert done.stderr.startswith(f"loadax-worker: {config}: pipeline 'noisy': the pipeline is not")
