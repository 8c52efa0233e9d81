"""Length-bucketed plans on remote loaders: the client, which alone has the lengths, names each
request's records (`BatchRequest.records`); the batches are the local loader's, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pipelines
import pytest
from helpers import assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st
from workers import WorkerProcess, worker_process

from loadax import Batcher, DataLoader, Pipeline, Plan, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.client.replies import ReplyDecoder
from loadax.errors import WorkerError
from loadax.plan.buckets import LengthBuckets
from loadax.plan.work import ListedWork, StepWork
from loadax.server.worker import Worker
from loadax.wire.limits import MAX_LISTED_ROWS, MAX_REQUEST_BYTES
from loadax.wire.plans import batch_request, request_digest, work_from_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

RECORDS = 30  # the `numbers` pipeline as tests/pipelines.py's worker config serves it
LENGTHS = np.random.default_rng(5).integers(1, 500, RECORDS)
RANGE = Pipeline(RangeDataset(0, RECORDS), Batcher())


def bucketed(builder: Any, sizes: list[tuple[int, int]]) -> Any:
    return (
        builder.batch_size_schedule(sizes)
        .bucket_by_length(LENGTHS, num_buckets=3)
        .shuffle(seed=9)
        .num_epochs(2)
    )


@pytest.fixture(scope="module")
def in_process() -> Iterator[Worker]:
    worker = Worker({"numbers": pipelines.numbers(RECORDS), "range": RANGE}, threads=2)
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("bucketed"), pipelines.SERVED) as worker:
        yield worker


def halves(loader: Any, state: dict[str, Any] | None = None) -> tuple[list[Any], Any, list[Any]]:
    """Five batches of `loader` (from `state`, if given), its state there, and the rest."""
    iterator = iter(loader)
    if state is not None:
        iterator.set_state(state, allow_new_batch_size=True)
    first = [next(iterator) for _ in range(5)]
    return first, json.loads(json.dumps(iterator.get_state())), list(iterator)


def test_a_bucketed_remote_loader_gives_the_local_batches_and_resumes_mid_epoch(
    in_process: Worker, served: WorkerProcess
) -> None:
    local = bucketed(DataLoader(pipelines.numbers(RECORDS).batcher), [(0, 4), (3, 6)])
    dataset = pipelines.numbers(RECORDS).dataset
    first, state, rest = halves(local.build(dataset))
    assert state["position"]["epoch"] == 0, "the resume must fall in the middle of an epoch"
    resumed = bucketed(DataLoader(pipelines.numbers(RECORDS).batcher), [(0, 5), (4, 3)])
    again, _, again_rest = halves(resumed.build(dataset), state)
    for target in (in_process, served.grpc):
        remote = RemoteDataLoader([target], pipeline="numbers").request_timeout(10)
        with bucketed(remote, [(0, 4), (3, 6)]).build() as loader:
            remote_first, remote_state, remote_rest = halves(loader)
            assert remote_state == state
            assert_batches_equal(remote_first + remote_rest, first + rest)
            # A state of the local loader, restored with new batch sizes, goes on alike.
            continued = iter(loader)
            continued.set_state(state)
            assert_batches_equal(list(continued), rest)
        with bucketed(remote, [(0, 5), (4, 3)]).build() as loader:
            remote_again, _, remote_again_rest = halves(loader, state)
            assert_batches_equal(remote_again + remote_again_rest, again + again_rest)
    # Every record of an epoch came once: the remainder rule keeps each bucket's short batch.
    seen = np.concatenate([batch["x"][:, 0] for batch in first + rest])
    assert sorted(seen.tolist()) == sorted(list(range(RECORDS)) * 2)


def test_a_block_shuffled_plan_travels_to_a_worker_process(served: WorkerProcess) -> None:
    # Another plan beyond a plain shuffle, on this module's worker process: its blocks travel
    # in the plan (Plan.blocks), not as named records.
    numbers = pipelines.numbers(RECORDS)

    def blocked(builder: Any) -> Any:
        return builder.batch_size(4).shuffle(seed=3, block_size=4, window=2).num_epochs(2)

    expected = list(blocked(DataLoader(numbers.batcher)).build(numbers.dataset))
    remote = RemoteDataLoader([served.grpc], pipeline="numbers").request_timeout(10)
    with blocked(remote).build() as loader:
        assert_batches_equal(loader, expected)


def test_an_array_sources_one_read_gives_the_same_bucketed_batches(in_process: Worker) -> None:
    assert RANGE.reads_rows  # the hot path: one read of the rows, whatever the work
    remote = RemoteDataLoader([in_process], pipeline="range").request_timeout(10)
    with bucketed(remote, [(0, 4), (3, 6)]).build() as loader:
        got = list(loader)
    expected = list(bucketed(DataLoader(RANGE.batcher), [(0, 4), (3, 6)]).build(RANGE.dataset))
    assert_batches_equal(got, expected)


def test_a_bucketed_remote_loader_refuses_what_it_cannot_send() -> None:
    remote = RemoteDataLoader(["grpc://127.0.0.1:1"], pipeline="numbers").batch_size(4)
    with pytest.raises(ValueError, match=r"bucket_by_length\(function\) .* pass an array"):
        remote.bucket_by_length(len, num_buckets=2).build()
    big = remote.batch_size_schedule([(0, 4), (9, MAX_LISTED_ROWS + 1)])
    with pytest.raises(ValueError, match=f"at most {MAX_LISTED_ROWS} records, got a batch size"):
        big.bucket_by_length(LENGTHS, num_buckets=2).build()


PLAN = Plan(RECORDS, 4, 3, True, 2, buckets=LengthBuckets(LENGTHS, num_buckets=3))


def test_a_request_names_its_records_and_its_digest_covers_them(in_process: Worker) -> None:
    fingerprint = in_process.info(wire.InfoRequest()).pipelines[0].fingerprint
    request = batch_request("numbers", fingerprint, PLAN, StepWork(9, np.array([1, 3])))
    listed = StepWork(9, np.array([1, 3])).listed(PLAN)
    assert list(request.rows) == [1, 3]
    named = np.frombuffer(request.records.indices, "<i8")
    assert named.tolist() == PLAN.indices(9, [1, 3]).tolist()
    assert request.records.epoch == listed.epoch == PLAN.epoch(9)
    digests = {request_digest(request)}
    for change in (
        lambda r: setattr(r.records, "epoch", r.records.epoch + 1),
        lambda r: setattr(r.records, "indices", r.records.indices[8:] + r.records.indices[:8]),
        lambda r: r.ClearField("records"),  # what a worker that does not know the field sees
    ):
        changed = wire.BatchRequest()
        changed.CopyFrom(request)
        change(changed)
        digests.add(request_digest(changed))
    assert len(digests) == 4
    # A worker that ignores the records answers the plain plan's rows: the client refuses them.
    old = wire.BatchRequest()
    old.CopyFrom(request)
    old.ClearField("records")
    batch = in_process.load_batch(old)
    batch.release()
    with pytest.raises(WorkerError, match="it answers another request") as refused:
        ReplyDecoder("old worker").decode(request, batch.header, batch.frames)
    assert refused.value.code == "DATA_LOSS"


def test_the_largest_listed_request_fits_a_request_and_a_larger_one_is_refused() -> None:
    rows = MAX_LISTED_ROWS + 1
    request = listed_request("f" * 64, list(range(rows)), np.arange(rows).tobytes(), 0)
    with pytest.raises(WorkerError, match=f"the records of at most {MAX_LISTED_ROWS} rows"):
        work_from_wire(request)
    del request.rows[-1]
    request.records.indices = request.records.indices[:-8]
    assert work_from_wire(request).check(Plan(rows, rows), 0) == MAX_LISTED_ROWS
    assert request.ByteSize() < MAX_REQUEST_BYTES


def listed_request(fingerprint: str, rows: list[int], indices: bytes, epoch: int) -> Any:
    request = batch_request("numbers", fingerprint, PLAN, StepWork(0))
    request.ClearField("rows")
    request.rows.extend(rows)
    request.records.CopyFrom(wire.ListedRecords(indices=indices, epoch=epoch))
    return request


int64s = st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    indices=st.one_of(
        int64s.map(lambda values: np.array(values, "<i8").tobytes()),
        st.lists(st.integers(0, RECORDS - 1), min_size=1, max_size=6).map(
            lambda values: np.array(values, "<i8").tobytes()
        ),
        st.binary(max_size=50),
    ),
    rows=st.one_of(st.lists(st.integers(0, 2**64 - 1), max_size=6), st.just(None)),
    epoch=st.integers(0, 2**64 - 1),
)
def test_a_worker_answers_listed_records_or_refuses_them_clearly(
    in_process: Worker, indices: bytes, rows: list[int] | None, epoch: int
) -> None:
    fingerprint = in_process.info(wire.InfoRequest()).pipelines[0].fingerprint
    count = len(indices) // 8
    rows = list(range(count)) if rows is None else rows
    request = listed_request(fingerprint, rows, indices, epoch)
    outcome: Any
    try:
        outcome = in_process.load_batch(request)
    except WorkerError as error:
        outcome = error
    if isinstance(outcome, WorkerError):
        assert outcome.code == "INVALID_ARGUMENT", outcome
        clear = ("8 bytes each", "one record per row", "rows must", "names record")
        assert any(text in outcome.message for text in clear), outcome.message
        return
    outcome.release()
    records = np.frombuffer(indices, "<i8").astype(np.int64)
    expected = pipelines.numbers(RECORDS).run(PLAN, ListedWork(0, np.arange(count), records, epoch))
    got = ReplyDecoder("w").decode(request, outcome.header, outcome.frames)
    assert_batches_equal([got], [expected])


def test_a_served_worker_refuses_a_record_beyond_its_dataset_and_keeps_serving(
    served: WorkerProcess,
) -> None:
    with grpc.insecure_channel(served.grpc_address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        fingerprint = stub.Info(wire.InfoRequest()).pipelines[0].fingerprint
        beyond = np.array([2, RECORDS], "<i8").tobytes()
        with pytest.raises(grpc.RpcError) as refused:
            stub.LoadBatch(listed_request(fingerprint, [0, 1], beyond, 0), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"names record {RECORDS}, beyond the dataset's {RECORDS} records" in str(
            refused.value.details()
        )
        good = np.array([2, 7], "<i8").tobytes()
        answer = stub.LoadBatch(listed_request(fingerprint, [0, 1], good, 1), timeout=10)
        assert answer.payload_size > 0
