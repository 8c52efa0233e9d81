"""BatchIterator: order, checkpoints, errors, and thread hygiene over every local executor."""

from __future__ import annotations

import gc
import itertools
import json
import threading
import time
from typing import Any

import numpy as np
import pytest
from helpers import (
    assert_batches_equal,
    assert_equal_output_after_checkpoint,
    join_loader_threads,
    loader_threads,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax import Batcher, DataLoader, InMemoryDataset, RangeDataset, RecordError


def image_like(index: int, rng: np.random.Generator) -> dict[str, Any]:
    return {"x": np.full((2, 3), index, np.float32) + rng.random((2, 3)), "label": index % 3}


def random_pipeline(workers: int, prefetch: int | None = None) -> DataLoader[Any, Any]:
    loader = DataLoader(Batcher()).batch_size(4).shuffle(seed=3).num_epochs(3).workers(workers)
    return loader if prefetch is None else loader.prefetch(prefetch)


DATASET = RangeDataset(0, 22).random_map(image_like, seed=5).shuffle(seed=1)


def test_worker_count_and_prefetch_do_not_change_the_batches() -> None:
    reference = list(random_pipeline(0).build(DATASET))
    assert len(reference) == 3 * 6
    for workers, prefetch in [(1, None), (1, 1), (2, 3), (4, None), (4, 1), (8, 16)]:
        assert_batches_equal(random_pipeline(workers, prefetch).build(DATASET), reference)


@settings(max_examples=25, deadline=None)
@given(
    num_records=st.integers(0, 40),
    batch_size=st.integers(1, 9),
    workers=st.integers(0, 5),
    epochs=st.integers(1, 3),
    drop=st.booleans(),
)
def test_batches_are_the_plan_in_order(
    num_records: int, batch_size: int, workers: int, epochs: int, drop: bool
) -> None:
    loader = (
        DataLoader(Batcher(lambda xs: xs))
        .batch_size(batch_size)
        .shuffle(seed=num_records)
        .num_epochs(epochs)
        .drop_remainder(drop)
        .workers(workers)
        .build(RangeDataset(0, num_records))
    )
    batches = list(loader)
    assert batches == [loader.plan.indices(step).tolist() for step in range(len(loader))]


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_restore_at_every_step_yields_the_same_batches(workers: int) -> None:
    assert_equal_output_after_checkpoint(random_pipeline(workers).build(DATASET))


def test_restore_works_across_worker_counts() -> None:
    source = iter(random_pipeline(3).build(DATASET))
    list(itertools.islice(source, 7))
    state = source.get_state()
    target = iter(random_pipeline(0).build(DATASET))
    target.set_state(state)
    assert_batches_equal(target, list(random_pipeline(1).build(DATASET))[7:])


def test_state_is_small_json() -> None:
    iterator = iter(random_pipeline(2).build(DATASET))
    next(iterator)
    state = iterator.get_state()
    assert json.loads(json.dumps(state)) == state
    assert len(json.dumps(state)) < 300
    assert state["step"] == 1


def test_infinite_loader_restores_far_into_the_future() -> None:
    loader = DataLoader(Batcher()).batch_size(3).num_epochs(None).shuffle(7).build(DATASET)
    iterator = iter(loader)
    state = iterator.get_state()
    state["step"] = 10_000
    iterator.set_state(state)
    batch = next(iterator)
    assert_batches_equal([batch], [loader.pipeline.load(loader.plan, 10_000)])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"batch_size": 5}, "batch_size is 5 in the state but 4 in this loader"),
        ({"seed": 9}, "seed is 9 in the state but 3"),
        ({"num_records": 23}, "num_records is 23 in the state but 22"),
        ({"shuffle": False}, "shuffle is False in the state but True"),
        ({"num_epochs": None}, "num_epochs is None in the state but 3"),
    ],
)
def test_state_of_another_plan_is_rejected(change: dict[str, Any], named: str) -> None:
    iterator = iter(random_pipeline(1).build(DATASET))
    state = iterator.get_state()
    state["plan"] = {**state["plan"], **change}
    with pytest.raises(ValueError, match=f"another plan: .*{named}"):
        iterator.set_state(state)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([], "must be a dict"),
        ({"step": 0}, "lacks"),
        ({"version": 99, "step": 0, "plan": {}}, "version 99"),
        ({"version": 1, "step": 0, "plan": [1]}, "plan"),
        ("not a state", "must be a dict"),
    ],
)
def test_malformed_state_is_rejected(state: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        iter(random_pipeline(1).build(DATASET)).set_state(state)


@pytest.mark.parametrize("step", [-1, 1.5, True, 19])
def test_state_with_a_bad_step_is_rejected(step: Any) -> None:
    iterator = iter(random_pipeline(1).build(DATASET))
    state = iterator.get_state()
    with pytest.raises(ValueError, match="step"):
        iterator.set_state({**state, "step": step})


def test_state_at_the_end_gives_an_exhausted_iterator() -> None:
    loader = random_pipeline(2).build(DATASET)
    iterator = iter(loader)
    iterator.set_state({**iterator.get_state(), "step": len(loader)})
    assert list(iterator) == []


def failing_on(bad: int) -> Any:
    def fn(x: int) -> int:
        if x == bad:
            raise ZeroDivisionError(f"cannot load {x}")
        return x

    return fn


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_a_failing_record_reaches_the_loop_naming_its_index(workers: int) -> None:
    loader = (
        DataLoader(Batcher(lambda xs: xs))
        .batch_size(4)
        .workers(workers)
        .build(RangeDataset(0, 20).map(failing_on(9)))
    )
    iterator = iter(loader)
    assert next(iterator) == [0, 1, 2, 3]
    assert next(iterator) == [4, 5, 6, 7]
    with pytest.raises(RecordError, match=r"record 9 .*ZeroDivisionError: cannot load 9") as error:
        next(iterator)
    assert error.value.index == 9
    assert isinstance(error.value.__cause__, ZeroDivisionError)
    # The state still points at the failed step, so the failure is not skipped silently.
    assert iterator.get_state()["step"] == 2
    with pytest.raises(RecordError):
        next(iterator)
    iterator.close()


def test_the_error_names_the_index_the_plan_asked_for_when_shuffled() -> None:
    dataset = InMemoryDataset(list(range(30))).map(failing_on(17))
    loader = DataLoader(Batcher(lambda xs: xs)).batch_size(30).shuffle(seed=4).build(dataset)
    with pytest.raises(RecordError) as error:
        next(iter(loader))
    assert error.value.index == 17


def test_a_failing_batcher_reaches_the_loop_with_the_step() -> None:
    def collate(xs: list[int]) -> int:
        if 6 in xs:
            raise ValueError("bad batch")
        return sum(xs)

    iterator = iter(DataLoader(Batcher(collate)).batch_size(3).workers(2).build(RangeDataset(0, 9)))
    assert next(iterator) == 3
    with pytest.raises(ValueError, match="bad batch") as error:
        list(iterator)
    assert "step 2" in " ".join(getattr(error.value, "__notes__", []))
    iterator.close()


def slow_identity(x: int) -> int:
    time.sleep(0.01)
    return x


def test_close_releases_the_worker_threads() -> None:
    loader = DataLoader(Batcher()).batch_size(2).workers(4).prefetch(4)
    iterator = iter(loader.build(RangeDataset(0, 100).map(slow_identity)))
    next(iterator)
    assert loader_threads()
    iterator.close()
    assert join_loader_threads() == []
    assert list(iterator) == []


def test_context_manager_and_exhaustion_release_the_worker_threads() -> None:
    loader = DataLoader(Batcher()).batch_size(2).workers(3).build(RangeDataset(0, 10))
    with iter(loader) as iterator:
        next(iterator)
    assert join_loader_threads() == []
    assert len(list(iter(loader))) == 5
    assert join_loader_threads() == []


def test_an_abandoned_iterator_releases_its_threads_when_collected() -> None:
    loader = DataLoader(Batcher()).batch_size(2).workers(3).build(RangeDataset(0, 1000))
    iterator = iter(loader)
    next(iterator)
    del iterator
    gc.collect()
    assert join_loader_threads() == []


def test_an_exhausted_iterator_restored_to_an_earlier_step_loads_again() -> None:
    loader = DataLoader(Batcher(lambda xs: xs)).batch_size(2).workers(2).build(RangeDataset(0, 6))
    iterator = iter(loader)
    start = iterator.get_state()
    assert list(iterator) == [[0, 1], [2, 3], [4, 5]]
    iterator.set_state(start)
    assert list(iterator) == [[0, 1], [2, 3], [4, 5]]


def test_a_waiting_training_loop_does_not_spin() -> None:
    release = threading.Event()

    def blocked(x: int) -> int:
        release.wait()
        return x

    loader = DataLoader(Batcher(lambda xs: xs)).batch_size(1).workers(1)
    iterator = iter(loader.build(RangeDataset(0, 1).map(blocked)))
    timer = threading.Timer(0.5, release.set)
    timer.start()
    cpu_before = time.thread_time()
    assert next(iterator) == [0]
    # Blocked on a future for about half a second: a spinning consumer would burn all of it.
    assert time.thread_time() - cpu_before < 0.25
    timer.join()
    iterator.close()
