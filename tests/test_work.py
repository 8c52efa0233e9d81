"""Work items: what they read, how they name themselves, their checks, and their wire form."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loadax.errors import WorkerError
from loadax.plan.planner import Plan
from loadax.plan.work import MAX_POSITION, StepWork, StreamWindow, Work
from loadax.wire.plans import batch_request, plan_to_wire, work_from_wire
from loadax.wire.v1 import worker_pb2 as wire

PLAN = Plan(num_records=10, batch_size=4, seed=1, shuffle=True, num_epochs=2)


def test_a_step_reads_its_rows_of_the_plan_in_one_epoch() -> None:
    indices, epochs = StepWork(4, np.array([1, 3])).records(PLAN, 0)
    assert indices.tolist() == PLAN.indices(4, [1, 3]).tolist()
    assert epochs.tolist() == [1, 1]


def test_a_window_reads_its_shards_positions_across_epochs() -> None:
    window = StreamWindow(shards=2, shard=1, index=2)
    indices, epochs = window.records(PLAN, 3)
    expected = PLAN.records_at(np.array([13, 15, 17]))
    assert indices.tolist() == expected[0].tolist()
    assert epochs.tolist() == expected[1].tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    ("work", "label", "ordinal"),
    [
        (StepWork(7), "the batch of step 7", 7),
        (StreamWindow(4, 1, 3), "window 3 of data shard 1 of 4", 13),
    ],
)
def test_work_names_itself_and_orders_by_ordinal(work: Work, label: str, ordinal: int) -> None:
    assert (str(work), work.ordinal) == (label, ordinal)


@pytest.mark.parametrize(
    ("work", "error", "message"),
    [
        (StepWork(6), IndexError, "step 6 is beyond the plan's 6 steps"),
        (StepWork(2, np.array([0, 2])), ValueError, "outside the batch of 2 rows"),
        (StepWork(0, np.array([4])), ValueError, "outside the batch of 4 rows"),
        (StreamWindow(1, 0, 5), IndexError, "window 5 of shard 0 is beyond the end"),
    ],
)
def test_check_tells_malformed_work_from_work_beyond_the_plan(
    work: Work, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        work.check(PLAN, 4)


def test_check_counts_the_records_read() -> None:
    assert StepWork(2).check(PLAN, 0) == 2  # the short last batch of an epoch
    assert StepWork(0, np.array([0, 3])).check(PLAN, 0) == 2
    assert StreamWindow(3, 2, 1).check(PLAN, 4) == 2  # positions 14 and 17 of 20


@pytest.mark.parametrize(
    "work", [StepWork(3), StepWork(3, np.array([0, 2, 3])), StreamWindow(2, 1, 3)]
)
def test_work_travels_to_the_wire_and_back(work: Work) -> None:
    request = batch_request("numbers", "abc", PLAN, work)
    assert (request.pipeline, request.fingerprint, request.step) == ("numbers", "abc", work.ordinal)
    parsed = wire.BatchRequest.FromString(request.SerializeToString())
    back = work_from_wire(parsed)
    assert type(back) is type(work)
    assert str(back) == str(work)
    assert [part.tolist() for part in back.records(PLAN, 3)] == [
        part.tolist() for part in work.records(PLAN, 3)
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rows": [3, 2]}, "rows must ascend"),
        ({"rows": [1, 1]}, "rows must ascend"),
        ({"rows": [2**64 - 1]}, "rows must lie within the batch"),
        ({"rows": [MAX_POSITION]}, "rows must lie within the batch"),
        ({"window": {"shards": 2, "shard": 0, "index": 0}, "rows": [0]}, "has no rows"),
        ({"window": {"shards": 2, "shard": 2, "index": 0}}, "window 2/2/0: shard must be <"),
        ({"window": {"shards": 0, "shard": 0, "index": 0}}, "window 0/0/0: shards must be >= 1"),
    ],
)
def test_malformed_work_on_the_wire_is_an_invalid_argument(
    fields: dict[str, Any], message: str
) -> None:
    request = wire.BatchRequest(pipeline="numbers", plan=plan_to_wire(PLAN), **fields)
    with pytest.raises(WorkerError, match=message) as refusal:
        work_from_wire(request)
    assert refusal.value.code == "INVALID_ARGUMENT"
