"""Plans beyond a fixed batch: batch-size schedules, a new batch size at resume, length buckets.

Every record of each epoch comes once (counted), across every change, for any process count.
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter
from typing import Any

import multihost_batch_size_check as check
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from processes import run_jax_processes

from loadax import Batcher, DataLoader, Pipeline, Plan, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.dataset.packing import Packer
from loadax.plan.buckets import LengthBuckets
from loadax.server.worker import Worker

FEW = settings(max_examples=25, deadline=None)
FITS = ("first_fit", "best_fit")

changes = st.lists(
    st.tuples(st.integers(1, 40), st.integers(1, 12)), max_size=3, unique_by=lambda c: c[0]
).map(lambda pairs: tuple(sorted(pairs)))


def epochs_of(plan: Plan, steps: range) -> dict[int, Counter[int]]:
    """The records each epoch's steps deliver, counted."""
    seen: dict[int, Counter[int]] = {}
    for step in steps:
        seen.setdefault(plan.epoch(step), Counter()).update(plan.indices(step).tolist())
    return seen


def assert_exactly_once(seen: dict[int, Counter[int]], records: int, drops: bool) -> None:
    for epoch, counts in seen.items():
        assert max(counts.values(), default=1) == 1, f"epoch {epoch} repeats a record"
        if not drops:
            assert sorted(counts) == list(range(records)), f"epoch {epoch} misses records"


@FEW
@given(
    records=st.integers(1, 60),
    size=st.integers(1, 12),
    sizes=changes,
    drop=st.booleans(),
    shuffle=st.booleans(),
)
def test_a_schedule_delivers_every_record_once_per_epoch(
    records: int, size: int, sizes: tuple[tuple[int, int], ...], drop: bool, shuffle: bool
) -> None:
    plan = Plan(records, size, 3, shuffle, 3, drop, batch_size_changes=sizes)
    total = plan.num_steps
    assert total is not None
    assert_exactly_once(epochs_of(plan, range(total)), records, drop)
    for epoch in range(3):
        assert all(plan.epoch(step) == epoch for step in plan.epoch_steps(epoch))
    assert {plan.batch_length(step) for step in range(total)} <= plan.batch_lengths()


@FEW
@given(
    records=st.integers(1, 60),
    saved=st.integers(1, 12),
    resumed=st.integers(1, 12),
    at=st.integers(0, 30),
    drop=st.booleans(),
    bucketed=st.booleans(),
)
def test_a_new_batch_size_continues_the_epoch_with_every_record_once(
    records: int, saved: int, resumed: int, at: int, drop: bool, bucketed: bool
) -> None:
    lengths = np.random.default_rng(records).integers(1, 100, records)
    buckets = LengthBuckets(lengths, num_buckets=3) if bucketed else None
    before = Plan(records, saved, 7, True, 2, drop, buckets=buckets)
    assert before.num_steps is not None
    at = min(at, before.num_steps)
    after = Plan(records, resumed, 7, True, 2, drop, buckets=buckets).resumed(
        at, before.position(at)
    )
    assert after.num_steps is not None
    seen = epochs_of(before, range(at))
    for epoch, counts in epochs_of(after, range(at, after.num_steps)).items():
        seen.setdefault(epoch, Counter()).update(counts)
    assert_exactly_once(seen, records, drop)


@FEW
@given(records=st.integers(1, 80), size=st.integers(1, 9), buckets=st.integers(1, 5))
def test_every_bucketed_step_comes_from_one_bucket_and_rows_split_alike(
    records: int, size: int, buckets: int
) -> None:
    lengths = np.random.default_rng(size).lognormal(3, 1, records).astype(np.int64)
    grouped = LengthBuckets(lengths, num_buckets=buckets)
    plan = Plan(records, size, 1, True, 2, buckets=grouped, batch_size_changes=((3, size + 1),))
    assert plan.num_steps is not None
    label = np.searchsorted(grouped.boundaries, lengths, side="right")
    for step in range(plan.num_steps):
        indices = plan.indices(step)
        assert len(set(label[indices].tolist())) == 1
        # Two processes' halves of the rows are the whole batch's.
        half = len(indices) // 2
        parts = [plan.indices(step, rows) for rows in (slice(0, half), slice(half, None))]
        assert np.concatenate(parts).tolist() == indices.tolist()
    assert_exactly_once(epochs_of(plan, range(plan.num_steps)), records, drops=False)


def test_bucketing_the_same_lengths_twice_makes_the_same_plan() -> None:
    lengths = np.random.default_rng(0).integers(1, 4096, 5000)
    first, second = (
        Plan(5000, 64, 2, True, None, buckets=LengthBuckets(lengths, [256, 1024])) for _ in range(2)
    )
    assert first.describe() == second.describe()
    for step in (0, 77, 200):
        assert first.indices(step).tolist() == second.indices(step).tolist()


def test_a_loaders_schedule_restores_at_every_step() -> None:
    builder = DataLoader(Batcher()).batch_size_schedule([(0, 4), (3, 6)]).shuffle(seed=2)
    loader = builder.num_epochs(2).build(RangeDataset(0, 23))
    reference = [batch.tolist() for batch in loader]
    assert len(loader) == len(reference)
    states = []
    with iter(loader) as iterator:
        for _ in reference:
            states.append(iterator.get_state())
            next(iterator)
    for step, state in enumerate(states):
        resumed = iter(loader)
        resumed.set_state(json.loads(json.dumps(state)))
        assert [batch.tolist() for batch in resumed] == reference[step:]


def test_a_new_batch_size_needs_the_flag_and_old_states_still_restore() -> None:
    dataset = RangeDataset(0, 20)
    old = iter(DataLoader(Batcher()).batch_size(4).build(dataset))
    for _ in range(2):
        next(old)
    state = old.get_state()
    new = DataLoader(Batcher()).batch_size(3).build(dataset)
    with pytest.raises(ValueError, match=r"allow_new_batch_size=True"):
        iter(new).set_state(state)
    del state["position"]  # as loadax saved states before positions
    resumed = iter(new)
    resumed.set_state(state, allow_new_batch_size=True)
    assert [batch.tolist() for batch in resumed] == [
        [8, 9, 10],
        [11, 12, 13],
        [14, 15, 16],
        [17, 18, 19],
    ]
    # Saved again, the resumed plan restores into the same loader without the flag.
    again = iter(new)
    again.set_state(resumed.get_state())
    assert list(again) == []


def resumed_batches(saved: Any, resumed: Any) -> list[Any]:
    """Three batches of `saved`, then the rest from `resumed` restored with its state."""
    iterator = iter(saved)
    batches = [next(iterator).tolist() for _ in range(3)]
    continued = iter(resumed)
    continued.set_state(iterator.get_state(), allow_new_batch_size=True)
    return batches + [batch.tolist() for batch in continued]


def test_a_remote_loader_resumes_with_a_new_batch_size_as_a_local_one() -> None:
    dataset = RangeDataset(0, 30)
    worker = Worker({"numbers": Pipeline(dataset, Batcher())}, threads=1)
    remote = RemoteDataLoader([worker], pipeline="numbers").request_timeout(10)
    try:
        results = []
        for builder in (remote, DataLoader(Batcher())):
            first = builder.batch_size_schedule([(0, 4), (2, 6)]).shuffle(seed=4).num_epochs(2)
            second = builder.batch_size(5).shuffle(seed=4).num_epochs(2)
            if isinstance(builder, RemoteDataLoader):
                with first.build() as saved, second.build() as resumed:
                    results.append(resumed_batches(saved, resumed))
            else:
                results.append(resumed_batches(first.build(dataset), second.build(dataset)))
        assert results[0] == results[1]
        seen = Counter(index for batch in results[0] for index in batch)
        assert set(seen.values()) == {2}
        assert sorted(seen) == list(range(30))
    finally:
        worker.close()


def test_two_by_four_to_one_by_eight_with_a_new_schedule_gives_the_same_global_batches(
    tmp_path: pathlib.Path,
) -> None:
    state = tmp_path / "state.json"
    script = pathlib.Path(check.__file__)
    saved = run_jax_processes(script, 2, 4, f"--save-state={state}")[0]
    resumed = run_jax_processes(script, 1, 8, f"--restore-state={state}")[0]
    multi = [
        batch
        for output in (saved, resumed)
        for line in output.splitlines()
        if line.startswith("batches ")
        for batch in json.loads(line.removeprefix("batches "))
    ]
    # The reference: one process, no mesh, the same restore.
    first = iter(check.builder(check.SAVED_SCHEDULE).build(check.DATASET))
    reference = [next(first) for _ in range(check.SAVE_AT)]
    second = iter(check.builder(check.RESUMED_SCHEDULE).build(check.DATASET))
    second.set_state(first.get_state(), allow_new_batch_size=True)
    reference += list(second)
    assert len(multi) == len(reference)
    for got, expected in zip(multi, reference, strict=True):
        assert np.asarray(got["x"], np.float32).tobytes() == expected["x"].tobytes()
        assert got["id"] == expected["id"].tolist()
    counts = Counter(index for batch in multi for index in batch["id"])
    assert sorted(counts) == list(range(check.RECORDS))
    assert set(counts.values()) == {2}


@FEW
@given(sizes=st.lists(st.integers(1, 16), max_size=40))
def test_both_packings_keep_every_token_once_and_best_fit_is_deterministic(
    sizes: list[int],
) -> None:
    sequences = [[position] * size for position, size in enumerate(sizes)]
    first, best = (Packer(16, pad_value=-1, strategy=kind)(sequences) for kind in FITS)
    for rows in (first, best):
        tokens = Counter(t for row in rows for t in row["tokens"].tolist() if t >= 0)
        assert tokens == Counter(dict(enumerate(sizes)))
    assert [r["tokens"].tolist() for r in best] == [
        r["tokens"].tolist() for r in Packer(16, pad_value=-1, strategy="best_fit")(sequences)
    ]
