"""A batch the pipeline's own code cannot make (ragged leaves, a batcher that raises) is the
pipeline's failure, `PipelineFailed`: answered at once, on every transport, and rebuilt by the
client as the exception the local loader raises; a failure of the worker's own machine is not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import failure_pipelines
import pytest

import loadax
from loadax import DataLoader
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import RemoteCause, WorkerError
from loadax.plan.work import StepWork
from loadax.server.grpc_server import GrpcServer
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_frames
from loadax.wire.failures import (
    MAX_CAUSE_CHARS,
    MAX_TRACEBACK_CHARS,
    PipelineFailed,
    error_from_reply,
    error_reply,
)
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

PLAN = loadax.Plan(64, batch_size=4)
WAIT_S = 30.0


def local_error(pipeline: loadax.Pipeline[Any, Any]) -> ValueError:
    """What the local loader raises for the first batch of `pipeline`, whose rows are ragged."""
    loader = DataLoader(pipeline.batcher).batch_size(PLAN.batch_size).workers(0)
    with pytest.raises(ValueError, match="pad_batcher") as raised:
        next(iter(loader.build(pipeline.dataset)))
    return raised.value


def through_the_wire(failed: PipelineFailed) -> PipelineFailed:
    """`failed` as a client reads it from the `ErrorReply` (both transports carry one)."""
    body = error_reply(failed).SerializeToString()
    again = error_from_reply(wire.ErrorReply.FromString(body))
    assert isinstance(again, PipelineFailed)
    return again


def test_a_pipeline_failure_travels_and_is_rebuilt_as_the_same_exception() -> None:
    error = local_error(failure_pipelines.ragged())
    assert isinstance(error, ValueError)
    failed = through_the_wire(PipelineFailed.of(error, 0))
    assert (failed.code, failed.failure.step) == ("ABORTED", 0)
    assert failed.message == f"the batch of step 0 failed: ValueError: {error}"
    rebuilt = failed.rebuild("grpc://10.0.0.5:50051")
    assert type(rebuilt) is ValueError
    assert str(rebuilt) == str(error)
    assert "pad_batcher" in str(rebuilt)
    note = rebuilt.__notes__[0]
    assert note.startswith("loadax: raised on grpc://10.0.0.5:50051; the traceback there:\n")
    assert "while collating the batch of step 0" in note  # the worker's notes, in its traceback


@pytest.mark.parametrize(
    "error",
    [KeyError("label"), TypeError("bad"), ZeroDivisionError("division by zero")],
    ids=lambda error: type(error).__name__,
)
def test_builtin_exceptions_are_rebuilt_with_their_type_and_message(error: Exception) -> None:
    rebuilt = through_the_wire(PipelineFailed.of(error, 3)).rebuild("w")
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)


def test_a_type_no_client_can_build_is_a_remote_cause_naming_it() -> None:
    error = failure_pipelines.ShapeError(4, "refused")
    rebuilt = through_the_wire(PipelineFailed.of(error, 7)).rebuild("w")
    assert isinstance(rebuilt, RemoteCause)
    assert rebuilt.type_name == "ShapeError"
    assert str(rebuilt) == "ShapeError: refused (step 4)"
    # A builtin that a message alone does not build is one too.
    decode = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert type(through_the_wire(PipelineFailed.of(decode, 0)).rebuild("w")) is RemoteCause


def test_what_travels_is_bounded() -> None:
    error = ValueError("x" * 100_000)
    error.add_note("y" * 100_000)
    failure = PipelineFailed.of(error, 0).failure
    assert len(failure.cause_message) < MAX_CAUSE_CHARS + 100
    assert len(failure.traceback) < MAX_TRACEBACK_CHARS + 100
    assert len(error_reply(PipelineFailed(failure)).SerializeToString()) < 4096


@pytest.fixture(scope="module", params=[0, 1], ids=["threads", "processes"])
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    worker = Worker(
        {
            "ragged": failure_pipelines.ragged(),
            "refusing": failure_pipelines.refusing(),
            "exhausting": failure_pipelines.exhausting(),
            "unreachable": failure_pipelines.unreachable(),
            "missing": failure_pipelines.missing(),
        },
        threads=2,
        processes=request.param,
    )
    yield worker
    worker.close()


def ask(worker: Worker, pipeline: str, step: int = 0) -> WorkerError:
    fingerprint = worker.handshake(
        wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(PLAN)
        )
    ).fingerprint
    with pytest.raises(WorkerError) as raised:
        worker.load_batch(batch_request(pipeline, fingerprint, PLAN, StepWork(step)))
    return raised.value


def test_a_batch_the_batcher_cannot_make_is_the_pipelines_failure(worker: Worker) -> None:
    expected = local_error(failure_pipelines.ragged())
    answer = ask(worker, "ragged", step=0)
    assert isinstance(answer, PipelineFailed)
    rebuilt = answer.rebuild("in-process Worker")
    assert (type(rebuilt), str(rebuilt)) == (type(expected), str(expected))


def test_an_error_that_cannot_be_pickled_back_keeps_its_type_name(worker: Worker) -> None:
    answer = ask(worker, "refusing", step=2)
    assert isinstance(answer, PipelineFailed)
    assert (answer.failure.step, answer.failure.cause_type) == (2, "ShapeError")
    assert answer.failure.cause_message == "this batcher refuses every batch (step 4)"


def test_a_stores_refusal_is_raised_as_a_storage_error_naming_the_url(worker: Worker) -> None:
    answer = ask(worker, "missing")
    assert isinstance(answer, PipelineFailed)
    rebuilt = answer.rebuild("in-process Worker")
    assert isinstance(rebuilt, loadax.StorageError)
    assert (rebuilt.url, str(rebuilt)) == ("s3://bucket/key", "no object 's3://bucket/key'")
    assert not rebuilt.transient


@pytest.mark.parametrize(
    ("pipeline", "cause"),
    [
        ("exhausting", "MemoryError: cannot allocate a batch of 4 rows"),
        ("unreachable", "StorageError: cannot reach 's3://bucket/key'"),
    ],
)
def test_memory_and_storage_failures_are_the_workers_not_the_pipelines(
    worker: Worker, pipeline: str, cause: str
) -> None:
    answer = ask(worker, pipeline)
    assert not isinstance(answer, PipelineFailed)
    assert answer.code == "UNAVAILABLE"  # asked again, elsewhere or later
    assert cause in answer.message


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_pipeline_failure_reaches_the_client_as_it_is_on_either_transport(
    transport: str,
) -> None:
    worker = Worker({"ragged": failure_pipelines.ragged()}, threads=2)
    if transport == "grpc":
        server: GrpcServer | ZmqServer = GrpcServer(
            worker, "127.0.0.1:0", threads=2, max_in_flight_per_client=4
        )
        client: GrpcTransport | ZmqTransport = GrpcTransport(f"grpc://{server.start()}")
    else:
        server = ZmqServer(worker, "tcp://127.0.0.1:0", threads=2)
        client = ZmqTransport(server.start())
    try:
        fingerprint = client.handshake(
            wire.HandshakeRequest(
                library_version=loadax.__version__, pipeline="ragged", plan=plan_to_wire(PLAN)
            )
        ).fingerprint
        request = batch_request("ragged", fingerprint, PLAN, StepWork(5))
        answer = client.send(request).exception(WAIT_S)
        assert isinstance(answer, PipelineFailed)
        assert (answer.code, answer.failure.step) == ("ABORTED", 5)
        assert type(answer.rebuild(client.name)) is ValueError
    finally:
        client.close()
        server.stop(0)
        worker.close()


def test_the_zeromq_framing_carries_it() -> None:
    failed = PipelineFailed.of(ValueError("ragged"), 9)
    with pytest.raises(PipelineFailed) as raised:
        zmq_frames.parse_batch_reply(zmq_frames.error_frames(1, failed))
    assert raised.value.failure == failed.failure


def test_work_its_closing_cancels_is_answered_unavailable_not_logged_as_internal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hold, started, finish = threading.Event(), threading.Event(), threading.Event()

    def held(index: int) -> int:
        if hold.is_set():
            started.set()
            finish.wait(WAIT_S)
        return index

    pipeline = loadax.Pipeline(loadax.RangeDataset(0, 64).map(held), loadax.Batcher())
    worker = Worker({"held": pipeline}, threads=1)
    fingerprint = worker.handshake(
        wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline="held", plan=plan_to_wire(PLAN)
        )
    ).fingerprint
    answers: dict[int, object] = {}

    def load(step: int) -> None:
        try:
            answers[step] = worker.load_batch(
                batch_request("held", fingerprint, PLAN, StepWork(step))
            )
        except WorkerError as error:
            answers[step] = error

    load(5)  # the worker learns the batch's size: later requests are admitted side by side
    hold.set()
    first = threading.Thread(target=load, args=(0,))
    first.start()
    assert started.wait(WAIT_S)  # step 0 holds the one loading thread; step 1 waits its turn
    second = threading.Thread(target=load, args=(1,))
    second.start()
    # Step 1 waits in the loading pool's queue (white box: no event says so) before it closes.
    pool = worker._executors["held"]._pool  # type: ignore[attr-defined]
    deadline = time.monotonic() + WAIT_S
    while pool._work_queue.qsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # a poll: nothing to wait on
    closing = threading.Thread(target=worker.close)
    closing.start()
    second.join(WAIT_S)
    finish.set()
    for thread in (first, closing):
        thread.join(WAIT_S)
    cancelled = answers[1]
    assert isinstance(cancelled, WorkerError), cancelled
    assert cancelled.code == "UNAVAILABLE"  # asked again elsewhere
    assert cancelled.message == "the batch of step 1 was cancelled: this worker is shutting down"
    assert not isinstance(answers[0], WorkerError)  # work started is finished
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
