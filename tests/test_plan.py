"""Tests for loadax/plan.py: which global records make the batch of each step."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax.plan.planner import PLAN_VERSION, Plan

HYPOTHESIS = settings(max_examples=60, deadline=None)

plans = st.builds(
    Plan,
    num_records=st.integers(min_value=0, max_value=200),
    batch_size=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**40),
    shuffle=st.booleans(),
    num_epochs=st.integers(min_value=1, max_value=3),
    drop_remainder=st.booleans(),
)


def _expected_steps_per_epoch(num_records: int, batch_size: int, drop_remainder: bool) -> int:
    full, remainder = divmod(num_records, batch_size)
    return full if drop_remainder or remainder == 0 else full + 1


def _epoch_indices(plan: Plan, epoch: int) -> list[int]:
    steps = range(epoch * plan.steps_per_epoch, (epoch + 1) * plan.steps_per_epoch)
    return [index for step in steps for index in plan.indices(step).tolist()]


@HYPOTHESIS
@given(plan=plans)
def test_each_record_appears_once_per_epoch(plan: Plan) -> None:
    for epoch in range(plan.num_epochs or 1):
        indices = _epoch_indices(plan, epoch)
        if plan.drop_remainder:
            assert len(indices) == plan.steps_per_epoch * plan.batch_size
            assert len(set(indices)) == len(indices)
            assert set(indices) <= set(range(plan.num_records))
        else:
            assert sorted(indices) == list(range(plan.num_records))


@HYPOTHESIS
@given(
    num_records=st.integers(min_value=0, max_value=200),
    batch_size=st.integers(min_value=1, max_value=40),
    num_epochs=st.integers(min_value=1, max_value=3),
    drop_remainder=st.booleans(),
)
def test_unshuffled_plan_visits_records_in_order(
    num_records: int, batch_size: int, num_epochs: int, drop_remainder: bool
) -> None:
    plan = Plan(num_records, batch_size, num_epochs=num_epochs, drop_remainder=drop_remainder)
    kept = num_records - num_records % batch_size if drop_remainder else num_records
    for epoch in range(num_epochs):
        assert _epoch_indices(plan, epoch) == list(range(kept))


def test_unshuffled_batches_are_consecutive_ranges() -> None:
    plan = Plan(num_records=10, batch_size=4, num_epochs=2)
    batches = [plan.indices(step).tolist() for step in range(plan.num_steps or 0)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@HYPOTHESIS
@given(
    num_records=st.integers(min_value=10, max_value=300),
    batch_size=st.integers(min_value=1, max_value=50),
    seed=st.integers(min_value=0, max_value=2**40),
)
def test_shuffled_permutation_changes_every_epoch(
    num_records: int, batch_size: int, seed: int
) -> None:
    plan = Plan(num_records, batch_size, seed=seed, shuffle=True, num_epochs=3)
    orders = [_epoch_indices(plan, epoch) for epoch in range(3)]
    assert orders[0] != orders[1]
    assert orders[1] != orders[2]
    assert orders[0] != orders[2]


def test_shuffled_plan_is_not_the_identity_order() -> None:
    plan = Plan(num_records=100, batch_size=7, seed=1, shuffle=True)
    assert _epoch_indices(plan, 0) != list(range(100))


def test_different_seeds_give_different_orders() -> None:
    orders = {tuple(_epoch_indices(Plan(50, 8, seed=seed, shuffle=True), 0)) for seed in range(20)}
    assert len(orders) == 20


@HYPOTHESIS
@given(plan=plans)
def test_equal_parameters_give_identical_plans(plan: Plan) -> None:
    twin = Plan(
        num_records=plan.num_records,
        batch_size=plan.batch_size,
        seed=plan.seed,
        shuffle=plan.shuffle,
        num_epochs=plan.num_epochs,
        drop_remainder=plan.drop_remainder,
    )
    for step in range(plan.num_steps or 0):
        np.testing.assert_array_equal(plan.indices(step), twin.indices(step))


@st.composite
def plans_with_a_partition(draw: st.DrawFn) -> tuple[Plan, int, list[list[int]]]:
    plan = draw(plans.filter(lambda plan: (plan.num_steps or 0) > 0))
    step = draw(st.integers(min_value=0, max_value=(plan.num_steps or 1) - 1))
    rows = draw(st.permutations(range(plan.batch_length(step))))
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=4)))
    bounds = [0, *cuts, len(rows)]
    parts = [list(rows[start:stop]) for start, stop in itertools.pairwise(bounds)]
    return plan, step, parts


@HYPOTHESIS
@given(case=plans_with_a_partition())
def test_rows_of_any_partition_reassemble_the_batch(
    case: tuple[Plan, int, list[list[int]]],
) -> None:
    plan, step, parts = case
    whole = plan.indices(step).tolist()
    reassembled = [0] * len(whole)
    seen = 0
    for part in parts:
        as_list = plan.indices(step, part).tolist()
        as_array = plan.indices(step, np.array(part, dtype=np.int64)).tolist()
        assert as_list == as_array == [whole[row] for row in part]
        for row, index in zip(part, as_array, strict=True):
            reassembled[row] = index
        seen += len(part)
    assert seen == len(whole)
    assert reassembled == whole


@HYPOTHESIS
@given(plan=plans.filter(lambda plan: (plan.num_steps or 0) > 0), data=st.data())
def test_contiguous_slices_of_rows_concatenate_to_the_batch(
    plan: Plan, data: st.DataObject
) -> None:
    step = data.draw(st.integers(min_value=0, max_value=(plan.num_steps or 1) - 1))
    length = plan.batch_length(step)
    cuts = sorted(data.draw(st.lists(st.integers(0, length), max_size=4)))
    bounds = [0, *cuts, length]
    pieces = [plan.indices(step, slice(a, b)) for a, b in itertools.pairwise(bounds)]
    assert np.concatenate(pieces).tolist() == plan.indices(step).tolist()


def test_rows_accept_strided_and_reversed_slices() -> None:
    plan = Plan(num_records=30, batch_size=10, seed=4, shuffle=True)
    whole = plan.indices(1).tolist()
    assert plan.indices(1, slice(None, None, 3)).tolist() == whole[::3]
    assert plan.indices(1, slice(None, None, -1)).tolist() == whole[::-1]
    assert plan.indices(1, slice(-2, None)).tolist() == whole[-2:]
    assert plan.indices(1, []).tolist() == []


@HYPOTHESIS
@given(
    num_records=st.integers(min_value=1, max_value=500),
    batch_size=st.integers(min_value=1, max_value=64),
    num_epochs=st.integers(min_value=1, max_value=3),
    drop_remainder=st.booleans(),
)
def test_only_the_last_batch_of_an_epoch_is_short(
    num_records: int, batch_size: int, num_epochs: int, drop_remainder: bool
) -> None:
    plan = Plan(num_records, batch_size, num_epochs=num_epochs, drop_remainder=drop_remainder)
    per_epoch = _expected_steps_per_epoch(num_records, batch_size, drop_remainder)
    remainder = num_records % batch_size
    expected = [batch_size] * per_epoch
    if remainder and not drop_remainder:
        expected[-1] = remainder
    lengths = [plan.batch_length(step) for step in range(plan.num_steps or 0)]
    assert lengths == expected * num_epochs
    assert [len(plan.indices(step)) for step in range(plan.num_steps or 0)] == lengths


@HYPOTHESIS
@given(
    num_records=st.integers(min_value=0, max_value=10**6),
    batch_size=st.integers(min_value=1, max_value=1000),
    num_epochs=st.none() | st.integers(min_value=1, max_value=100),
    drop_remainder=st.booleans(),
)
def test_step_counts(
    num_records: int, batch_size: int, num_epochs: int | None, drop_remainder: bool
) -> None:
    plan = Plan(num_records, batch_size, num_epochs=num_epochs, drop_remainder=drop_remainder)
    per_epoch = _expected_steps_per_epoch(num_records, batch_size, drop_remainder)
    assert plan.steps_per_epoch == per_epoch
    if per_epoch == 0:
        assert plan.num_steps == 0
    elif num_epochs is None:
        assert plan.num_steps is None
    else:
        assert plan.num_steps == per_epoch * num_epochs


def test_a_plan_without_full_batches_has_no_steps() -> None:
    assert Plan(num_records=0, batch_size=4, num_epochs=None).num_steps == 0
    dropped = Plan(num_records=3, batch_size=4, num_epochs=None, drop_remainder=True)
    assert dropped.num_steps == 0
    with pytest.raises(IndexError, match="step 0"):
        dropped.indices(0)


def test_infinite_plan_serves_very_large_steps() -> None:
    plan = Plan(num_records=100, batch_size=10, num_epochs=None)
    assert plan.num_steps is None
    step = 10**12 + 3
    assert plan.epoch(step) == 10**11
    assert plan.indices(step).tolist() == list(range(30, 40))


def test_infinite_shuffled_plan_serves_very_large_steps() -> None:
    plan = Plan(num_records=100, batch_size=10, seed=3, shuffle=True, num_epochs=None)
    epoch = 10**11
    indices = [
        i for step in range(epoch * 10, epoch * 10 + 10) for i in plan.indices(step).tolist()
    ]
    assert sorted(indices) == list(range(100))
    assert indices != _epoch_indices(plan, 0)


@pytest.mark.parametrize(("step", "expected"), [(0, 0), (2, 0), (3, 1), (5, 1), (6, 2), (8, 2)])
def test_epoch_of_step(step: int, expected: int) -> None:
    plan = Plan(num_records=10, batch_size=4, num_epochs=3)
    assert plan.epoch(step) == expected


@pytest.mark.parametrize("step", [6, 7, 1000])
def test_step_beyond_the_plan_raises_index_error_naming_it(step: int) -> None:
    plan = Plan(num_records=10, batch_size=4, num_epochs=2)
    with pytest.raises(IndexError, match=rf"step {step}\b"):
        plan.indices(step)
    with pytest.raises(IndexError, match=rf"step {step}\b"):
        plan.epoch(step)
    with pytest.raises(IndexError, match=rf"step {step}\b"):
        plan.batch_length(step)


@pytest.mark.parametrize("step", [-1, 1.0, "0", True, None])
def test_invalid_step_raises_value_error_naming_it(step: Any) -> None:
    plan = Plan(num_records=10, batch_size=4)
    with pytest.raises(ValueError, match="step"):
        plan.indices(step)


@pytest.mark.parametrize(
    ("step", "rows"),
    [(0, [4]), (0, [0, 4]), (0, [-1]), (0, np.array([2, 7])), (2, [2]), (2, np.array([0, 3]))],
)
def test_rows_outside_the_batch_raise_index_error(step: int, rows: Any) -> None:
    # Steps 0 and 1 have rows 0..3; step 2 is the short last batch with rows 0 and 1 only.
    plan = Plan(num_records=10, batch_size=4)
    with pytest.raises(IndexError, match="rows"):
        plan.indices(step, rows)


def test_rows_past_a_short_batch_raise_index_error() -> None:
    plan = Plan(num_records=10, batch_size=4)
    assert plan.indices(2, [0, 1]).tolist() == [8, 9]
    with pytest.raises(IndexError, match="rows"):
        plan.indices(2, [2])


@pytest.mark.parametrize(
    "rows",
    [1, "ab", [0.0, 1.0], np.array([0.5]), [[0, 1]], np.zeros((2, 1), dtype=np.int64), [True]],
)
def test_rows_of_the_wrong_type_raise_value_error(rows: Any) -> None:
    plan = Plan(num_records=10, batch_size=4)
    with pytest.raises(ValueError, match="rows"):
        plan.indices(0, rows)


VALID = {"num_records": 10, "batch_size": 4}


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("num_records", -1),
        ("num_records", 10.0),
        ("num_records", True),
        ("num_records", "10"),
        ("batch_size", 0),
        ("batch_size", -3),
        ("batch_size", True),
        ("batch_size", 2.5),
        ("seed", -1),
        ("seed", False),
        ("seed", 1.5),
        ("seed", None),
        ("num_epochs", 0),
        ("num_epochs", -2),
        ("num_epochs", True),
        ("num_epochs", 1.0),
        ("shuffle", 1),
        ("shuffle", "yes"),
        ("shuffle", None),
        ("drop_remainder", 0),
        ("drop_remainder", "no"),
    ],
)
def test_invalid_constructor_argument_raises_value_error_naming_it(
    argument: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=argument):
        Plan(**{**VALID, argument: value})


def test_describe_round_trips_through_json() -> None:
    plan = Plan(num_records=10, batch_size=4, seed=3, shuffle=True, num_epochs=None)
    description = plan.describe()
    assert json.loads(json.dumps(description)) == description
    assert description == {
        "version": PLAN_VERSION,
        "num_records": 10,
        "batch_size": 4,
        "seed": 3,
        "shuffle": True,
        "num_epochs": None,
        "drop_remainder": False,
    }


def test_describe_is_json_serialisable_when_built_from_numpy_ints() -> None:
    # Lengths and seeds often arrive as numpy ints (`array.shape`, `np.sum`); they pass validation,
    # so the plan must describe itself as plain JSON all the same.
    plan = Plan(num_records=np.int64(100), batch_size=np.int32(10), seed=np.uint64(5))
    description = json.loads(json.dumps(plan.describe()))
    assert description == Plan(num_records=100, batch_size=10, seed=5).describe()


@pytest.mark.parametrize(
    ("argument", "other"),
    [
        ("num_records", 11),
        ("batch_size", 5),
        ("seed", 1),
        ("shuffle", True),
        ("num_epochs", None),
        ("num_epochs", 2),
        ("drop_remainder", True),
    ],
)
def test_describe_differs_when_any_parameter_differs(argument: str, other: Any) -> None:
    base = Plan(**VALID)
    changed = Plan(**{**VALID, argument: other})
    assert base.describe() != changed.describe()
    assert json.dumps(base.describe(), sort_keys=True) != json.dumps(
        changed.describe(), sort_keys=True
    )


def test_describe_names_the_plan_version() -> None:
    assert Plan(**VALID).describe()["version"] == PLAN_VERSION


def test_ten_billion_record_shuffled_plan_gives_valid_indices() -> None:
    num_records, batch_size = 10**10, 4096
    plan = Plan(num_records, batch_size, seed=12, shuffle=True, num_epochs=5)
    per_epoch = plan.steps_per_epoch
    assert per_epoch == -(-num_records // batch_size)
    steps = [0, 1, per_epoch - 1, 4 * per_epoch + 17, 5 * per_epoch - 1]
    batches = {step: plan.indices(step) for step in steps}
    for step, indices in batches.items():
        assert indices.min() >= 0
        assert indices.max() < num_records
        assert np.unique(indices).size == indices.size == plan.batch_length(step)
    assert plan.epoch(4 * per_epoch + 17) == 4
    # Steps of one epoch never share a record.
    first_epoch = np.concatenate([batches[0], batches[1], batches[per_epoch - 1]])
    assert np.unique(first_epoch).size == first_epoch.size
    assert plan.batch_length(per_epoch - 1) == num_records - (per_epoch - 1) * batch_size
