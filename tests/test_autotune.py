"""Autotune: the rule (`decide`) from measured numbers, the tuner on a virtual clock, and loaders
with workers("auto") / prefetch("auto") that tune, report it, and yield the same batches."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
from helpers import assert_batches_equal

from loadax import Batcher, DataLoader, RangeDataset
from loadax.execution.autotune import WINDOW, Autotuner, Limits, Measured, decide
from loadax.iterators.stats import Tuning

MB = 1 << 20


def measured(waited: float, workers: int = 1, prefetch: int = 2, size: int = MB) -> Measured:
    """A window of 10 batches over 1 s in which the loop waited `waited` s."""
    return Measured(10, 1.0, waited, workers, prefetch, size)


def test_a_starved_loop_gets_the_workers_that_make_a_batch_per_step() -> None:
    limits = Limits(max_workers=64, memory_bytes=1024 * MB, processes=True)
    # A batch every 0.1 s from 1 worker; the loop works 0.02 s per batch: 5 x 1.25 -> 7.
    tuning = decide(measured(waited=0.8), limits)
    assert (tuning.workers, tuning.prefetch) == (7, 6)
    assert tuning.batch_seconds == pytest.approx(0.1)
    assert tuning.loop_seconds == pytest.approx(0.02)
    assert decide(measured(0.8), Limits(4, 1024 * MB, processes=True)).workers == 4
    # Threads split a batch: 13 of them make one in 15 ms, within a step: 2 ahead will do.
    threads = decide(measured(0.8, workers=2), Limits(64, 1024 * MB, processes=False))
    assert (threads.workers, threads.prefetch) == (13, 2)


def test_a_loop_that_does_not_wait_keeps_what_it_has_and_workers_never_shrink() -> None:
    limits = Limits(max_workers=64, memory_bytes=1024 * MB, processes=False)
    assert decide(measured(0.01, workers=6, prefetch=3), limits).workers == 6
    assert decide(measured(0.01, workers=6, prefetch=3), limits).prefetch == 3


def test_the_memory_budget_bounds_workers_and_depth() -> None:
    tuning = decide(measured(0.8, size=64 * MB), Limits(64, 512 * MB, processes=True))
    assert (tuning.workers, tuning.prefetch) == (4, 4)  # 8 batches: 4 in processes, 4 ahead
    only_depth = Limits(64, 512 * MB, processes=False, workers=False)
    assert decide(measured(0.9, size=128 * MB), only_depth).prefetch == 4


def test_the_tuner_measures_windows_after_the_first_batch_and_reports_changes() -> None:
    now = [0.0]
    reports: list[Tuning] = []
    tuner = Autotuner(Limits(8, 1024 * MB, processes=True), 1, 2, reports.append, lambda: now[0])
    batch = np.zeros(4, np.float32)
    tuner.took(0.0, 0.0, batch)  # the first batch (start-up) opens the window only
    for _ in range(WINDOW):  # the loop works 10 ms, then waits 40 ms for the next batch
        asked = now[0] = now[0] + 0.01
        now[0] += 0.04
        tuner.took(asked, now[0], batch)
    assert len(reports) == 1
    # One worker makes a batch every 50 ms; the loop takes 10 ms: 5 x 1.25 -> 7.
    assert (reports[0].workers, reports[0].prefetch) == (7, 6) == (tuner.workers, tuner.prefetch)
    assert reports[0].batch_bytes == 16


def test_the_tuner_stops_adding_workers_that_do_not_speed_loading_up() -> None:
    now = [0.0]
    reports: list[Tuning] = []
    limits = Limits(64, 1024 * MB, processes=False, prefetch=False)
    tuner = Autotuner(limits, 1, 2, reports.append, lambda: now[0])
    batch = np.zeros(4, np.float32)

    def batches(count: int) -> None:  # the loop works 10 ms, then waits 40 ms: one per 50 ms
        for _ in range(count):
            asked = now[0] = now[0] + 0.01
            now[0] += 0.04
            tuner.took(asked, now[0], batch)

    batches(1 + WINDOW)
    assert tuner.workers == 7  # a batch per 50 ms from 1 thread, 10 ms of loop: 5 x 1.25
    batches(2 + 1 + WINDOW)  # 2 loaded before the change, 1 to open the window, then a window
    # 7 threads deliver no faster than 1 did: the work is bound elsewhere (the GIL, say).
    assert (tuner.workers, tuner.limits.max_workers, len(reports)) == (7, 7, 1)


def slow(index: int) -> dict[str, Any]:
    time.sleep(0.002)  # a record's I/O: the GIL is free meanwhile
    return {"x": np.full(3, index, dtype=np.int64)}


def test_auto_loaders_tune_log_and_yield_the_same_batches(caplog: pytest.LogCaptureFixture) -> None:
    dataset = RangeDataset(0, 96).map(slow)
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=1)
    expected = list(builder.workers(0).build(dataset))
    with caplog.at_level(logging.INFO, logger="loadax.execution.autotune"):
        loader = builder.workers("auto").prefetch("auto").build(dataset)
        assert_batches_equal(loader, expected)
    tuning = loader.stats().tuning
    assert tuning is not None
    assert (tuning.kind, tuning.workers > 1) == ("threads", True)
    assert "autotune:" in caplog.text
    assert_batches_equal(loader.epoch(0), expected)  # a new iterator starts from the tuning

    auto_processes = builder.workers("auto", kind="processes").prefetch("auto")
    with auto_processes.memory_budget_mb(64).build(dataset) as loader:
        assert_batches_equal(loader, expected)
        assert repr(auto_processes).endswith(".workers('auto', kind='processes').prefetch('auto')")


def test_auto_needs_loading_workers_and_a_positive_budget() -> None:
    with pytest.raises(ValueError, match=r"prefetch\('auto'\) needs workers\(n\) with n >= 1"):
        DataLoader(Batcher()).workers(0).prefetch("auto")
    with pytest.raises(ValueError, match="memory_budget_mb must be >= 1"):
        DataLoader(Batcher()).memory_budget_mb(0)
    assert (
        repr(DataLoader(Batcher()).workers("auto").workers(3)) == "DataLoader(Batcher()).workers(3)"
    )
