"""Tests for loadax/collate/batcher.py: collating the records of a batch."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import jax
import numpy as np
import pytest
from helpers import assert_batches_equal

from loadax import Batcher, DataLoader, RangeDataset, stack
from loadax.buffers import BufferPool
from loadax.collate import batcher
from loadax.collate.batcher import POOLED_FROM_BYTES, SharedStack
from loadax.errors import RecordError
from loadax.execution.pipeline import Pipeline
from loadax.execution.threads import ThreadExecutor
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork


def test_stacks_python_ints() -> None:
    batch = Batcher()([1, 2, 3])
    assert isinstance(batch, np.ndarray)
    assert batch.dtype == np.int64
    assert batch.tolist() == [1, 2, 3]


def test_stacks_python_floats_and_bools() -> None:
    floats = Batcher()([0.5, 1.5])
    assert floats.dtype == np.float64
    assert floats.tolist() == [0.5, 1.5]
    bools = Batcher()([True, False, True])
    assert bools.dtype == np.bool_
    assert bools.tolist() == [True, False, True]


def test_stacks_numpy_scalars_keeping_their_dtype() -> None:
    batch = Batcher()([np.float16(1), np.float16(2)])
    assert batch.dtype == np.float16
    assert batch.tolist() == [1.0, 2.0]


def test_stacks_arrays_along_a_new_leading_axis() -> None:
    records = [np.full((2, 3), value, dtype=np.float32) for value in range(4)]
    batch = Batcher()(records)
    assert batch.shape == (4, 2, 3)
    assert batch.dtype == np.float32
    assert batch[:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_stacks_dicts_leaf_wise() -> None:
    records = [
        {"image": np.full((2, 2), i, dtype=np.uint8), "label": i, "weight": 0.5 * i}
        for i in range(3)
    ]
    batch = Batcher()(records)
    assert set(batch) == {"image", "label", "weight"}
    assert batch["image"].shape == (3, 2, 2)
    assert batch["image"].dtype == np.uint8
    assert batch["image"][:, 1, 1].tolist() == [0, 1, 2]
    assert batch["label"].dtype == np.int64
    assert batch["label"].tolist() == [0, 1, 2]
    assert batch["weight"].dtype == np.float64
    assert batch["weight"].tolist() == [0.0, 0.5, 1.0]


def test_stacks_tuples_leaf_wise() -> None:
    records = [(np.arange(3, dtype=np.int32) + i, i) for i in range(2)]
    batch = Batcher()(records)
    assert isinstance(batch, tuple)
    assert len(batch) == 2
    assert batch[0].shape == (2, 3)
    assert batch[0].dtype == np.int32
    assert batch[0].tolist() == [[0, 1, 2], [1, 2, 3]]
    assert batch[1].tolist() == [0, 1]


def test_stacks_nested_pytrees_leaf_wise() -> None:
    def record(i: int) -> dict[str, Any]:
        return {
            "inputs": (np.full(4, i, dtype=np.int8), [i, float(i)]),
            "meta": {"id": i, "mask": np.array([True, i % 2 == 0])},
        }

    batch = Batcher()([record(i) for i in range(3)])
    tokens, pair = batch["inputs"]
    assert tokens.shape == (3, 4)
    assert tokens.dtype == np.int8
    assert isinstance(pair, list)
    assert pair[0].tolist() == [0, 1, 2]
    assert pair[0].dtype == np.int64
    assert pair[1].dtype == np.float64
    assert batch["meta"]["id"].tolist() == [0, 1, 2]
    assert batch["meta"]["mask"].shape == (3, 2)
    assert batch["meta"]["mask"].tolist() == [[True, True], [True, False], [True, True]]


def test_none_leaves_are_kept() -> None:
    batch = Batcher()([{"x": 1, "extra": None}, {"x": 2, "extra": None}])
    assert batch["extra"] is None
    assert batch["x"].tolist() == [1, 2]


def test_stack_is_the_default_collation() -> None:
    records = [{"a": np.ones(2)}, {"a": np.zeros(2)}]
    assert Batcher()(records)["a"].tolist() == stack(records)["a"].tolist() == [[1, 1], [0, 0]]


@pytest.mark.parametrize(
    "records",
    [
        [{"a": 1}, {"b": 1}],
        [{"a": 1}, {"a": 1, "b": 2}],
        [(1, 2), [1, 2]],
        [(1, 2), (1, 2, 3)],
        [{"a": None}, {"a": 1}],
        [np.zeros(2), np.zeros(3)],
        [{"a": np.zeros((2, 2))}, {"a": np.zeros((2, 3))}],
    ],
)
def test_mismatched_structures_raise_value_error(records: list[Any]) -> None:
    with pytest.raises(ValueError, match=r"structure|shape"):
        Batcher()(records)


@pytest.mark.parametrize(
    "records",
    [
        [{"a": 1}, {"a": None}],
        [{"a": 1}, {"a": {"b": 2}}],
        [1, {"a": 1}],
        [np.float32(1), None],
    ],
)
def test_a_leaf_where_the_first_record_has_a_leaf_must_be_a_leaf(records: list[Any]) -> None:
    # The first record's structure is a prefix of the second's: a check by prefix alone (as
    # jax.tree.map does) would stack the mismatched leaves into an object array instead.
    with pytest.raises(ValueError, match="record 1 of the batch has structure"):
        Batcher()(records)


def test_bytes_and_text_stack_whole_and_trailing_nuls_are_refused_not_cut() -> None:
    batch = stack([{"raw": b"ab", "text": "x"}, {"raw": b"\x00c", "text": "yz"}])
    assert batch["raw"].tolist() == [b"ab", b"\x00c"]
    assert batch["text"].tolist() == ["x", "yz"]
    for values in ([b"ab", b"c\x00"], ["x\x00", "yz"]):
        with pytest.raises(ValueError, match=r"row \d of the batch .* ending in NUL"):
            stack([{"raw": value} for value in values])
    # Through the loader's shared stack too (parts of equal width).
    loader = DataLoader(Batcher()).batch_size(2).workers(2).build([b"a\x00", b"b\x00"])
    with pytest.raises(ValueError, match="ending in NUL"):
        next(iter(loader))


def test_empty_list_raises_value_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        Batcher()([])


def test_custom_fn_is_called_with_the_list_of_records() -> None:
    calls: list[list[int]] = []

    def collate(records: list[int]) -> int:
        calls.append(records)
        return sum(records)

    batcher = Batcher(collate)
    assert batcher([1, 2, 3]) == 6
    assert calls == [[1, 2, 3]]


def test_custom_fn_may_return_anything() -> None:
    assert Batcher(list)([3, 1]) == [3, 1]
    assert Batcher(lambda records: None)([1]) is None


@pytest.mark.parametrize("fn", [3, "stack", [len]])
def test_non_callable_fn_raises_value_error_naming_it(fn: Any) -> None:
    with pytest.raises(ValueError, match="fn"):
        Batcher(fn)


def test_repr_names_the_function() -> None:
    assert repr(Batcher()) == "Batcher()"
    assert repr(Batcher(sorted)) == "Batcher(sorted)"


def test_a_shared_stack_equals_stack_and_steps_aside_when_parts_differ() -> None:
    records = [{"x": np.full(3, i, np.int16), "y": float(i)} for i in range(7)]
    shared = SharedStack([3, 4])
    shared.place(1, records[3:])
    shared.place(0, records[:3])
    assert_batches_equal([shared.batch()], [stack(records)])
    # Promotion across parts, or another structure or shape, is left to stack().
    for other in ({"x": np.full(3, 9, np.int64), "y": 9.0}, {"x": np.full(3, 9, np.int16)}):
        mixed = SharedStack([3, 1])
        mixed.place(0, records[:3])
        mixed.place(1, [other])
        assert mixed.batch() is None


@pytest.mark.parametrize("workers", [2, 3])
def test_threaded_batches_promote_and_refuse_exactly_as_stack(workers: int) -> None:
    promoted = [np.int32(1), np.int32(2), 3, 4]  # int32 parts and a Python int part
    loader = DataLoader(Batcher()).batch_size(4).workers(workers).build(promoted)
    (batch,) = list(loader)
    assert batch.dtype == stack(list(promoted)).dtype
    ragged = [np.zeros(2), np.zeros(2), np.zeros(3), np.zeros(2)]
    with pytest.raises(ValueError, match="leaf \\(the record itself\\) of record 2 has shape"):
        list(DataLoader(Batcher()).batch_size(4).workers(workers).build(ragged))


# --- large leaves are stacked into reused buffers ----------------------------------------------

LARGE_ROWS = 8
LARGE_FLOATS = POOLED_FROM_BYTES // 4 // LARGE_ROWS + 1  # a stacked leaf just over the threshold


def large_record(index: int) -> dict[str, Any]:
    return {"x": np.full(LARGE_FLOATS, index, np.float32), "label": index}


def large_batches(workers: int) -> Any:
    dataset = [large_record(index) for index in range(LARGE_ROWS * 12)]
    return DataLoader(Batcher()).batch_size(LARGE_ROWS).workers(workers).build(dataset)


def expected_x(step: int) -> np.ndarray[Any, Any]:
    rows = np.arange(step * LARGE_ROWS, (step + 1) * LARGE_ROWS, dtype=np.float32)
    return np.repeat(rows[:, None], LARGE_FLOATS, axis=1)


class CountingPool(BufferPool):
    """A `BufferPool` that counts what it hands out and knows the buffers it handed out."""

    def __init__(self) -> None:
        super().__init__(spare=2)
        self.taken = 0
        self._handed_out: dict[int, weakref.ref[np.ndarray[Any, Any]]] = {}

    def take(self, size: int) -> memoryview:
        view = super().take(size)
        self.taken += 1
        buffer = view.obj.base
        self._handed_out[id(buffer)] = weakref.ref(buffer)
        return view

    @property
    def buffers(self) -> list[np.ndarray[Any, Any]]:
        """The buffers it handed out that are still alive."""
        return [buffer for ref in self._handed_out.values() if (buffer := ref()) is not None]


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> CountingPool:
    counting = CountingPool()
    monkeypatch.setattr(batcher, "_LEAF_BUFFERS", counting)
    return counting


@pytest.mark.parametrize("workers", [0, 2])  # stack, and SharedStack's parts from threads
def test_a_steady_stream_stacks_large_leaves_into_the_same_few_buffers(
    pool: CountingPool, workers: int
) -> None:
    for step, batch in enumerate(large_batches(workers)):
        np.testing.assert_array_equal(batch["x"], expected_x(step))
        assert any(np.shares_memory(batch["x"], buffer) for buffer in pool.buffers)
        assert batch["label"].flags.owndata  # a small leaf is left to malloc
        del batch
    assert pool.taken == 12  # one per batch's large leaf
    assert len(pool.buffers) <= 4, len(pool.buffers)  # those in flight and spares


@pytest.mark.parametrize("workers", [0, 2])
def test_held_batches_and_jax_arrays_never_change_while_later_ones_are_stacked(
    pool: CountingPool, workers: int
) -> None:
    held, put = [], []
    for step, batch in enumerate(large_batches(workers)):
        if step % 2 == 0:
            held.append((step, batch))
        if step % 3 == 0:
            put.append((step, jax.device_put(batch["x"])))
    assert [step for step, _ in held] == list(range(0, 12, 2))
    for step, batch in held:
        np.testing.assert_array_equal(batch["x"], expected_x(step))
        assert batch["label"].tolist() == list(range(step * LARGE_ROWS, (step + 1) * LARGE_ROWS))
    for step, array in put:
        np.testing.assert_array_equal(np.asarray(array), expected_x(step))
    assert pool.taken == 12


@pytest.mark.parametrize("workers", [0, 2])
def test_large_leaves_of_python_objects_are_stacked_as_numpy_keeps_them(
    pool: CountingPool, workers: int
) -> None:
    words = np.array([f"w{i}" for i in range(POOLED_FROM_BYTES // 8)], dtype=object)
    dataset = [{"words": words, "n": index} for index in range(4)]
    batches = list(DataLoader(Batcher()).batch_size(2).workers(workers).build(dataset))
    assert [batch["words"].shape for batch in batches] == [(2, len(words))] * 2
    assert batches[1]["words"][1, 7] == "w7"
    assert pool.taken == 0


def test_a_threaded_batch_gives_its_buffer_back_once_dropped_without_the_garbage_collector(
    pool: CountingPool,
) -> None:
    # A reference cycle through the chunks' callbacks kept each batch until the collector ran,
    # so that every batch was stacked into a fresh buffer (faulted in page by page): R1's worker
    # made 57 of its 130 batches in new buffers, and held up to 23 at once.
    dataset = [large_record(index) for index in range(LARGE_ROWS * 4)]
    executor = ThreadExecutor(Pipeline(dataset, Batcher()), threads=2)
    plan = Plan(len(dataset), LARGE_ROWS, shuffle=False)
    gc.disable()
    try:
        for step in range(4):
            batch = executor.submit(plan, StepWork(step)).result()
            np.testing.assert_array_equal(batch["x"], expected_x(step))
            del batch
            assert len(pool.buffers) == 1, f"step {step}: {len(pool.buffers)} buffers alive"
    finally:
        gc.enable()
        executor.release(wait=True)
    assert pool.taken == 4


class Recording:
    """A `StackInto` of this process's memory that records the rows copied into it."""

    def __init__(self) -> None:
        self.copied: list[tuple[int, int]] = []

    def leaves(self, structure: Any, kinds: Any) -> list[np.ndarray[Any, Any]]:
        return [np.empty(shape, dtype) for shape, dtype in kinds]

    def stacked(self, leaf: int, start: int, stop: int) -> None:
        self.copied.append((start, stop))


def test_a_failed_threaded_batch_fails_only_once_its_other_chunks_stopped_copying() -> None:
    # Chunk [2, 3] fails at once; chunk [0, 1] takes 0.3 s. Its rows go into memory that is the
    # batch's user's once the batch is done (a client's memory file, which its worker answers
    # with the failure): the failure is told only once no chunk copies into it any more.
    slow = threading.Event()

    def read(index: int) -> np.ndarray[Any, Any]:
        if index == 2:
            raise ValueError("record 2 is corrupt")
        if index == 0:
            slow.wait(0.3)
        return np.full(4, index)

    into = Recording()
    executor = ThreadExecutor(Pipeline(RangeDataset(0, 4).map(read), Batcher()), threads=2)
    try:
        pending = executor.submit(Plan(4, 4, shuffle=False), StepWork(0), into)
        with pytest.raises(RecordError, match="record 2 is corrupt"):
            pending.result()
        assert into.copied == [(0, 2)]  # chunk [0, 1] copied its rows before
    finally:
        executor.release(wait=True)
