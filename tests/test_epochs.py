"""`loader.epoch(e)`: the batches of one epoch, reshuffled per epoch as `.num_epochs(E)` gives them,
checkpointable within the epoch; iterators' `step` and `epoch`; and the warning when a loader
whose epochs differ is started over after a full pass."""

from __future__ import annotations

import doctest
import importlib
import json
import warnings
from typing import Any

import numpy as np
import pytest
from helpers import assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax import Batcher, DataLoader, Loader, Pipeline, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.iterators.passes import RepeatedEpochWarning
from loadax.server.worker import Worker


def noisy(index: int, rng: np.random.Generator) -> dict[str, Any]:
    """A record that depends on the epoch through its rng."""
    return {"x": np.array([index, int(rng.integers(1000))]), "y": index % 3}


def records(count: int) -> Any:
    # A dataset-level shuffle and a random map: both are keyed by the epoch the plan passes down.
    return RangeDataset(0, count).shuffle(seed=2).random_map(noisy, seed=4)


def epochs_of(loader: Loader[Any], count: int) -> list[list[Any]]:
    return [list(loader.epoch(epoch)) for epoch in range(count)]


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(0, 23),
    batch_size=st.integers(1, 6),
    epochs=st.integers(1, 4),
    shuffle=st.booleans(),
    drop=st.booleans(),
    workers=st.integers(0, 2),
)
def test_the_epochs_one_after_another_are_the_batches_of_num_epochs(
    count: int, batch_size: int, epochs: int, shuffle: bool, drop: bool, workers: int
) -> None:
    builder = DataLoader(Batcher()).batch_size(batch_size).workers(workers).drop_remainder(drop)
    if shuffle:
        builder = builder.shuffle(seed=count)
    whole = list(builder.num_epochs(epochs).build(records(count)))
    for built in (builder, builder.num_epochs(epochs), builder.num_epochs(None)):
        loader = built.build(records(count))
        per_epoch = epochs_of(loader, epochs)
        steps = loader.plan.steps_per_epoch
        assert [len(batches) for batches in per_epoch] == [steps] * epochs
        assert_batches_equal([batch for batches in per_epoch for batch in batches], whole)
    # Every epoch ends with its short batch, unless it is dropped.
    if count % batch_size and steps:
        last = per_epoch[0][-1]["y"]
        assert len(last) == (batch_size if drop else count % batch_size)


def test_each_epoch_has_its_own_order_and_draws() -> None:
    loader = DataLoader(Batcher()).batch_size(4).shuffle(seed=0).build(records(40))
    first, second = (np.concatenate([b["x"] for b in loader.epoch(e)]) for e in (0, 1))
    # The same records, in another order, with other random draws.
    assert sorted(first[:, 0]) == sorted(second[:, 0]) == list(range(40))
    assert first[:, 0].tolist() != second[:, 0].tolist()
    by_record = dict(zip(first[:, 0].tolist(), first[:, 1].tolist(), strict=True))
    assert by_record != dict(zip(second[:, 0].tolist(), second[:, 1].tolist(), strict=True))
    # Asking again for an epoch gives it again, exactly.
    assert_batches_equal(loader.epoch(1), loader.epoch(1))


def test_an_epoch_past_num_epochs_is_the_epoch_of_a_longer_plan() -> None:
    builder = DataLoader(Batcher()).batch_size(3).shuffle(seed=1)
    two = builder.num_epochs(2).build(records(10))
    five = builder.num_epochs(5).build(records(10))
    assert len(two) == 8
    assert_batches_equal(two.epoch(4), list(five)[16:20])


def restore_at_every_step(loader: Loader[Any], epoch: int) -> None:
    """Restoring the state saved before any step of an epoch yields exactly the rest of it."""
    expected = list(loader.epoch(epoch))
    iterator = loader.epoch(epoch)
    states = [iterator.get_state()]
    for _ in expected:
        next(iterator)
        states.append(iterator.get_state())
    first = epoch * loader.plan.steps_per_epoch
    for position, state in enumerate(states):
        assert (state["step"], state["epoch"]) == (first + position, epoch)
        restored = loader.epoch(epoch)
        restored.set_state(json.loads(json.dumps(state)))
        assert restored.step == first + position
        assert_batches_equal(restored, expected[position:])
    iterator.set_state(states[0])  # an iterator that ran ahead rewinds
    assert_batches_equal(iterator, expected)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_restores_at_every_step(workers: int) -> None:
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=3).workers(workers)
    loader = builder.build(records(14))
    for epoch in (0, 3):
        restore_at_every_step(loader, epoch)


def test_a_state_restores_only_into_its_own_epoch_or_at_its_boundary() -> None:
    loader = DataLoader(Batcher()).batch_size(2).shuffle(seed=0).build(records(6))
    iterator = loader.epoch(1)
    next(iterator)
    with pytest.raises(ValueError, match=r"step 4, in epoch 1; .* epoch 2 .*loader\.epoch\(1\)"):
        loader.epoch(2).set_state(iterator.get_state())
    list(iterator)
    end = iterator.get_state()  # step 6: the end of epoch 1 is the start of epoch 2
    exhausted, following = loader.epoch(1), loader.epoch(2)
    exhausted.set_state(end)
    following.set_state(end)
    assert list(exhausted) == []
    assert_batches_equal(following, loader.epoch(2))
    # A state of another plan is refused as by any iterator.
    other = DataLoader(Batcher()).batch_size(3).shuffle(seed=0).build(records(6))
    with pytest.raises(ValueError, match="batch_size is 2 in the state but 3"):
        other.epoch(1).set_state(end)


def test_epoch_states_and_whole_plan_states_are_interchangeable_within_the_plan() -> None:
    loader = DataLoader(Batcher()).batch_size(4).shuffle(seed=5).num_epochs(3).build(records(10))
    expected = list(loader)
    iterator = loader.epoch(1)
    next(iterator)
    whole = iter(loader)
    whole.set_state(iterator.get_state())
    assert whole.step == 4
    assert_batches_equal(whole, expected[4:])
    plain = iter(loader)
    for _ in range(4):
        next(plain)
    within = loader.epoch(1)
    within.set_state(plain.get_state())
    assert_batches_equal(within, expected[4:6])
    # Past the plan, a plain iterator says which iterator the state belongs to.
    beyond = loader.epoch(7)
    with pytest.raises(ValueError, match=r"beyond the plan's 9 steps.*loader\.epoch\(7\)"):
        iter(loader).set_state(beyond.get_state())


def test_iterators_say_their_step_and_epoch() -> None:
    loader = DataLoader(Batcher()).batch_size(2).num_epochs(2).build(RangeDataset(0, 5))
    iterator = iter(loader)
    positions = [(iterator.step, iterator.epoch)]
    for _ in iterator:
        positions.append((iterator.step, iterator.epoch))
    assert positions == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1), (6, 2)]
    one = loader.epoch(5)
    positions = [(one.step, one.epoch)]
    for _ in one:
        positions.append((one.step, one.epoch))
    assert positions == [(15, 5), (16, 5), (17, 5), (18, 5)]
    assert repr(one) == "<BatchIterator at step 18, epoch 5>"


def test_device_prefetch_epochs_and_their_positions() -> None:
    builder = DataLoader(Batcher()).batch_size(2).shuffle(seed=1)
    host, on_device = builder.build(records(6)), builder.device_prefetch(2).build(records(6))
    iterator = on_device.epoch(2)
    assert (iterator.step, iterator.epoch) == (6, 2)
    batches = [next(iterator)]
    assert (iterator.step, iterator.epoch) == (7, 2)  # the batches copying ahead do not count
    state = iterator.get_state()
    batches += list(iterator)
    assert_batches_equal(batches, host.epoch(2))
    resumed = on_device.epoch(2)
    resumed.set_state(state)
    assert_batches_equal(resumed, list(host.epoch(2))[1:])


def test_a_stream_has_no_epochs_of_its_own() -> None:
    stream = RangeDataset(0, 10).filter(lambda x: x % 2 == 0)
    loader = DataLoader(Batcher()).batch_size(2).num_epochs(2).build(stream)
    with pytest.raises(TypeError, match=r"no epochs of its own.*num_epochs\(E\)"):
        loader.epoch(0)
    iterator = iter(loader)
    assert (iterator.step, iterator.epoch) == (0, 0)
    assert [batch.tolist() for batch in iterator] == [[0, 2], [4, 6], [8, 0], [2, 4], [6, 8]]
    assert iterator.step == 5


@pytest.mark.parametrize("epoch", [-1, 1.5, "1", None])
def test_an_invalid_epoch_is_named(epoch: Any) -> None:
    loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4))
    with pytest.raises(ValueError, match="epoch"):
        loader.epoch(epoch)


def test_a_remote_loader_has_the_same_epochs() -> None:
    dataset = records(11)
    worker = Worker({"noisy": Pipeline(dataset, Batcher())}, threads=2)
    try:
        builder = RemoteDataLoader([worker], pipeline="noisy").batch_size(3).shuffle(seed=7)
        local = DataLoader(Batcher()).batch_size(3).shuffle(seed=7).build(dataset)
        with builder.build() as remote:
            for epoch in (0, 1, 4):  # 4 lies past the plan's one epoch
                assert_batches_equal(remote.epoch(epoch), local.epoch(epoch))
            iterator = remote.epoch(4)
            next(iterator)
            resumed = local.epoch(4)
            resumed.set_state(iterator.get_state())
            assert_batches_equal(resumed, list(local.epoch(4))[1:])
    finally:
        worker.close()


def test_a_second_full_pass_of_a_shuffled_loader_warns_once() -> None:
    loader = DataLoader(Batcher()).batch_size(2).shuffle(seed=0).build(RangeDataset(0, 6))
    first = list(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        partial = iter(loader)
        next(partial)  # stopped early: no pass
        resumed = iter(loader)
        resumed.set_state(resumed.get_state())
        list(resumed)  # restored: no pass either, whatever the step
    with pytest.warns(RepeatedEpochWarning, match=r"loader\.epoch\(e\)") as caught:
        again = list(loader)
    assert [warning.filename for warning in caught] == [__file__]  # names the loop
    assert_batches_equal(again, first)  # the documented behaviour: the same order again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)  # once per loader
        exhausted = iter(loader)
        list(exhausted)
        next(exhausted, None)


@pytest.mark.parametrize(
    ("builder", "dataset"),
    [
        (DataLoader(Batcher()).batch_size(2), RangeDataset(0, 6).shuffle(seed=1)),
        (DataLoader(Batcher()).batch_size(2), RangeDataset(0, 6).random_map(noisy)),
        (DataLoader(Batcher()).batch_size(2).shuffle(), RangeDataset(0, 6).filter(bool)),
        (DataLoader(Batcher()).batch_size(2).device_prefetch(1), RangeDataset(0, 6).shuffle()),
    ],
)
def test_epoch_keyed_datasets_streams_and_device_batches_warn_too(
    builder: Any, dataset: Any
) -> None:
    loader = builder.build(dataset)
    list(loader)
    with pytest.warns(RepeatedEpochWarning):
        list(loader)


def test_loaders_whose_epochs_are_alike_and_epoch_loops_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6).map(str))
        assert list(map(list, plain)) == list(map(list, plain))
        shuffled = DataLoader(Batcher()).batch_size(2).shuffle(seed=0).build(RangeDataset(0, 6))
        for _ in range(2):
            for epoch in range(3):
                list(shuffled.epoch(epoch))
        list(shuffled)


@pytest.mark.parametrize("module_name", ["loadax.iterators.passes", "loadax.state.checks"])
def test_the_examples_of_the_passes_and_state_modules_run(module_name: str) -> None:
    results = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0
    assert results.failed == 0
