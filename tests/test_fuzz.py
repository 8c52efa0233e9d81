"""Fuzzing the worker's request handling: whatever a client sends, the worker answers it or refuses
it with a known gRPC status code, never fails another way, never hangs, and keeps serving.

Inputs tried per run (derandomized: a run of the same tests tries the same inputs; hypothesis
also draws literals from the modules loaded, so running other test modules alongside shifts them a
little), and what became of them in a run of this module alone:

- the in-process `Worker` (one without, one with a memory budget): 2,000 batch requests (671
  answered, 1,329 refused) and 1,000 handshakes;
- a worker subprocess over gRPC: 2,000 raw request bodies, random bytes and mutated valid requests,
  to LoadBatch, Handshake and Info (answered, refused by the worker, or not parsable);
- the same subprocess over ZeroMQ: 2,000 raw multipart messages, random frames and requests with
  frames mutated, added or left out (answered, refused, or, without a request id, dropped).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc
import numpy as np
import pipelines
import pytest
import zmq
from helpers import assert_batches_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workers import WorkerProcess, worker_process

import loadax
from loadax.dataset.ops import dataset_length
from loadax.errors import WorkerError
from loadax.execution.pipeline import Pipeline
from loadax.plan.planner import Plan
from loadax.server.worker import Worker
from loadax.wire import zmq_frames
from loadax.wire.codec import decode, decode_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import plan_from_wire, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

HANG_S = 30.0  # an answer that takes longer than this is a hang
UINT64 = 2**64 - 1
KNOWN_CODES = frozenset(grpc.StatusCode.__members__) - {"OK"}
# What the worker itself answers to a bad request. INTERNAL would mean a bug: these pipelines
# never fail unexpectedly, and gRPC's own INTERNAL (a body that does not parse) is told apart.
REFUSALS = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "RESOURCE_EXHAUSTED",
        "ABORTED",  # a record of the pipeline "failing" failed
    }
)
BUDGET = 8_000  # a full batch of 8-pixel images is about 50 KB, 8 of its rows about 6 KB

SERVED = """
[pipelines.numbers]
factory = "pipelines:numbers"
args = { records = 100 }

[pipelines.images]
factory = "pipelines:images"
args = { records = 64, side = 8 }

[pipelines.failing]
factory = "pipelines:failing"
args = { records = 20, bad = 7 }
"""
PIPELINES: dict[str, Pipeline[Any, Any]] = {
    "numbers": pipelines.numbers(100),
    "images": pipelines.images(64, side=8),
    "failing": pipelines.failing(20, bad=7),
}

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- strategies ---------------------------------------------------------------------------------

extreme = st.one_of(
    st.sampled_from([0, 1, 2, 3, 7, 8, 19, 20, 63, 64, 99, 100, 101, 2**31, 2**32, 2**63, UINT64]),
    st.integers(0, UINT64),
)
names = st.one_of(
    st.sampled_from(sorted(PIPELINES)),
    st.sampled_from(sorted(PIPELINES)),
    st.text(max_size=24),
    st.sampled_from(["", "numbers\x00", "Numbers", "imágenes", "🦀" * 3, " numbers"]),
    st.integers(1_000, 100_000).map(lambda n: "n" * n),
)
rows: st.SearchStrategy[list[int]] = st.one_of(
    st.just([]),
    st.sets(st.integers(0, 70), max_size=12).map(sorted),
    st.lists(st.integers(0, 70), max_size=12),  # unsorted, duplicated
    st.lists(extreme, max_size=4),
    st.integers(0, 200_000).map(lambda n: list(range(n))),
)


@st.composite
def plans(draw: st.DrawFn, num_records: int) -> wire.Plan:
    plan = wire.Plan(
        num_records=draw(st.one_of(st.just(num_records), st.just(num_records), extreme)),
        batch_size=draw(st.one_of(st.integers(1, 70), extreme)),
        seed=draw(extreme),
        shuffle=draw(st.booleans()),
        drop_remainder=draw(st.booleans()),
    )
    epochs = draw(st.one_of(st.none(), st.integers(1, 3), extreme))
    if epochs is not None:
        plan.num_epochs = epochs
    return plan


def fingerprints_of(worker: Worker) -> dict[str, str]:
    return {info.name: info.fingerprint for info in worker.info(wire.InfoRequest()).pipelines}


@st.composite
def batch_requests(draw: st.DrawFn, fingerprints: dict[str, str]) -> wire.BatchRequest:
    """A valid request, with up to four of its fields then replaced by arbitrary values."""
    name = draw(st.sampled_from(sorted(PIPELINES)))
    plan = Plan(
        dataset_length(PIPELINES[name].dataset),
        draw(st.integers(1, 70)),
        seed=draw(extreme),
        shuffle=draw(st.booleans()),
        num_epochs=draw(st.one_of(st.none(), st.integers(1, 3))),
        drop_remainder=draw(st.booleans()),
    )
    total = plan.num_steps
    step = draw(st.integers(0, max(0, (50 if total is None else total) - 1)))
    length = plan.batch_length(step) if total != 0 else 1
    request = wire.BatchRequest(
        pipeline=name,
        fingerprint=fingerprints[name],
        plan=plan_to_wire(plan),
        step=step,
        rows=draw(st.one_of(st.just([]), st.sets(st.integers(0, length - 1)).map(sorted))),
    )
    fields = ["pipeline", "fingerprint", "num_records", "batch_size", "num_epochs", "step", "rows"]
    for field in sorted(draw(st.sets(st.sampled_from(fields), max_size=4))):
        if field == "pipeline":
            request.pipeline = draw(names)
        elif field == "fingerprint":
            request.fingerprint = draw(st.text(max_size=70))
        elif field == "num_records":
            request.plan.num_records = draw(extreme)
        elif field == "batch_size":
            request.plan.batch_size = draw(extreme)
        elif field == "num_epochs":
            if draw(st.booleans()):
                request.plan.ClearField("num_epochs")
            else:
                request.plan.num_epochs = draw(extreme)
        elif field == "step":
            request.step = draw(extreme)
        else:
            edge = [length - 1, length, length + 1, UINT64]
            wrong = draw(
                st.sampled_from(
                    [
                        draw(rows),
                        [*request.rows, draw(st.sampled_from(edge))],  # one past the batch
                        [*request.rows, *request.rows[-1:]],  # the last row twice
                        list(reversed(request.rows)),
                        [0, *request.rows],
                    ]
                )
            )
            request.ClearField("rows")
            request.rows.extend(wrong)
    return request


@st.composite
def handshakes(draw: st.DrawFn) -> wire.HandshakeRequest:
    version = draw(
        st.one_of(
            st.just(loadax.__version__),
            st.sampled_from(["", "0", "0.3", "0.2.9", "1.0.0", "0.3.0.dev1+local", "x.y.z"]),
            st.text(max_size=20),
        )
    )
    return wire.HandshakeRequest(library_version=version, pipeline=draw(names), plan=draw(plans(0)))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@st.composite
def mutated(draw: st.DrawFn, valid: list[bytes]) -> bytes:
    """A valid body with a few bytes flipped, inserted, deleted, or fields appended."""
    body = bytearray(draw(st.sampled_from(valid)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        operation = draw(
            st.sampled_from(
                ["flip", "flip", "insert", "delete", "truncate", "field", "field", "dup"]
            )
        )
        where = draw(st.integers(0, len(body)))
        if operation == "flip" and body:
            body[min(where, len(body) - 1)] ^= draw(st.integers(1, 255))
        elif operation == "insert":
            body[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif operation == "delete":
            del body[where : where + draw(st.integers(1, 8))]
        elif operation == "truncate":
            del body[where:]
        elif operation == "field":
            # A field of any number and wire type, with a value of any size.
            key = _varint(draw(st.integers(0, 2**32)))
            if draw(st.booleans()):
                body += key + _varint(draw(extreme))
            else:
                content = draw(st.binary(max_size=40))
                length = draw(st.one_of(st.just(len(content)), extreme))
                body += key + _varint(length) + content
        else:
            body += bytes(body)
    return bytes(body)


@st.composite
def bodies(draw: st.DrawFn, valid: list[bytes]) -> bytes:
    """Random bytes (a quarter of the time) or a mutated valid body."""
    if draw(st.sampled_from([True, False, False, False])):
        return draw(st.binary(max_size=300))
    return draw(mutated(valid))


# --- the in-process worker ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, Worker]]:
    built = {
        "unbounded": Worker(PIPELINES, threads=2),
        "budgeted": Worker(PIPELINES, threads=2, memory_budget_bytes=BUDGET, memory_wait_s=HANG_S),
    }
    yield built
    for worker in built.values():
        worker.close()


@pytest.fixture(scope="module")
def caller() -> Iterator[Callable[[Callable[[], Any]], Any]]:
    """Runs a call on another thread: its result or its WorkerError, or a failure if it hangs."""
    with ThreadPoolExecutor(1, thread_name_prefix="fuzz") as pool:

        def call(function: Callable[[], Any]) -> Any:
            future = pool.submit(function)
            try:
                return future.result(HANG_S)
            except WorkerError as error:
                return error
            except FutureTimeout:
                pytest.fail(f"no answer within {HANG_S} s", pytrace=False)

        yield call


def test_batch_requests_are_answered_or_refused_with_a_known_code(
    workers: dict[str, Worker], caller: Callable[[Callable[[], Any]], Any]
) -> None:
    fingerprints = fingerprints_of(workers["unbounded"])
    tried = {"answered": 0, "refused": 0}

    @settings(FUZZ, max_examples=2000)
    @given(request=batch_requests(fingerprints), which=st.sampled_from(sorted(workers)))
    def one(request: wire.BatchRequest, which: str) -> None:
        outcome = caller(lambda: workers[which].load_batch(request))
        if isinstance(outcome, WorkerError):
            tried["refused"] += 1
            assert outcome.code in REFUSALS, outcome
            return
        tried["answered"] += 1
        assert isinstance(outcome, EncodedBatch)
        outcome.release()  # as a transport does once the batch is sent
        assert outcome.step == request.step
        if which == "budgeted":
            assert outcome.size <= BUDGET
        pipeline = PIPELINES[request.pipeline]
        local = pipeline.load(plan_from_wire(request.plan), request.step, request.rows or None)
        assert_batches_equal([decode(outcome.payload)], [local])

    one()
    print(f"\nin-process batch requests: {tried}")
    assert sum(tried.values()) >= 2000
    assert min(tried.values()) >= 400, "the fuzzing should reach both answers and refusals"


def test_handshakes_are_answered_or_refused_with_a_known_code(
    workers: dict[str, Worker], caller: Callable[[Callable[[], Any]], Any]
) -> None:
    worker = workers["unbounded"]
    fingerprints = fingerprints_of(worker)
    tried = {"answered": 0, "refused": 0}

    @settings(FUZZ, max_examples=1000)
    @given(request=handshakes())
    def one(request: wire.HandshakeRequest) -> None:
        outcome = caller(lambda: worker.handshake(request))
        if isinstance(outcome, WorkerError):
            tried["refused"] += 1
            assert outcome.code in REFUSALS, outcome
            return
        tried["answered"] += 1
        assert isinstance(outcome, wire.HandshakeResponse)
        assert outcome.fingerprint == fingerprints[request.pipeline]
        assert outcome.num_records == dataset_length(PIPELINES[request.pipeline].dataset)

    one()
    print(f"\nin-process handshakes: {tried}")
    assert sum(tried.values()) >= 1000
    assert min(tried.values()) >= 80


# --- raw bytes into a worker subprocess ---------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("fuzzed"), SERVED, zmq=True) as worker:
        yield worker


@pytest.fixture(scope="module")
def channel(served: WorkerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(
        served.grpc_address, options=[("grpc.max_receive_message_length", 1 << 30)]
    ) as opened:
        yield opened


def valid_requests(
    fingerprints: dict[str, str],
) -> dict[str, list[bytes]]:
    """Serialized valid requests of every method, for the mutations to start from."""
    batch = [
        wire.BatchRequest(
            pipeline=name,
            fingerprint=fingerprints[name],
            plan=plan_to_wire(plan),
            step=step,
            rows=rows,
        )
        for name, plan, step, rows in [
            ("numbers", Plan(100, 8), 3, []),
            ("numbers", Plan(100, 8, seed=5, shuffle=True, num_epochs=None), 40, [1, 4]),
            ("images", Plan(64, 16, seed=2, shuffle=True), 2, [0, 15]),
            ("images", Plan(64, 64, drop_remainder=True, num_epochs=3), 2, []),
            ("failing", Plan(20, 4), 0, [3]),
        ]
    ]
    handshake = [
        wire.HandshakeRequest(
            library_version=loadax.__version__, pipeline=name, plan=plan_to_wire(Plan(0, 8))
        )
        for name in PIPELINES
    ]
    return {
        "LoadBatch": [request.SerializeToString() for request in batch],
        "Handshake": [request.SerializeToString() for request in handshake],
        "Info": [b""],
    }


def served_fingerprints(channel: grpc.Channel) -> dict[str, str]:
    info = worker_pb2_grpc.WorkerStub(channel).Info(wire.InfoRequest(), timeout=HANG_S)
    return {pipeline.name: pipeline.fingerprint for pipeline in info.pipelines}


RESPONSES: dict[str, type[wire.BatchResponse | wire.HandshakeResponse | wire.InfoResponse]] = {
    "LoadBatch": wire.BatchResponse,
    "Handshake": wire.HandshakeResponse,
    "Info": wire.InfoResponse,
}


def check_response(method: str, body: bytes) -> None:
    """A successful reply's body parses, and a batch's payload decodes."""
    response = RESPONSES[method]()
    response.ParseFromString(body)
    if isinstance(response, wire.BatchResponse):
        decode(response.payload)


def assert_still_serves(served: WorkerProcess, channel: grpc.Channel) -> None:
    """The worker process is alive, logged no unexpected failure, and a good request gets the
    batch the pipeline loads."""
    assert served.process.poll() is None, served.output()
    # gRPC logs the bodies it cannot parse (as ERROR grpc._common); loadax logs its own failures.
    assert " ERROR loadax" not in served.output(), served.output()
    plan = Plan(64, 16, seed=9, shuffle=True, num_epochs=2)
    request = wire.BatchRequest(
        pipeline="images",
        fingerprint=served_fingerprints(channel)["images"],
        plan=plan_to_wire(plan),
        step=5,
        rows=[2, 3, 11],
    )
    response = worker_pb2_grpc.WorkerStub(channel).LoadBatch(request, timeout=HANG_S)
    assert response.step == 5
    local = PIPELINES["images"].load(plan, 5, [2, 3, 11])
    assert_batches_equal([decode(response.payload)], [local])


def test_raw_grpc_bodies_never_crash_the_worker(
    served: WorkerProcess, channel: grpc.Channel
) -> None:
    valid = valid_requests(served_fingerprints(channel))
    calls = {
        method: channel.unary_unary(
            f"/loadax.wire.v1.Worker/{method}",
            request_serializer=None,
            response_deserializer=None,
        )
        for method in valid
    }
    tried = {"answered": 0, "refused": 0, "unparsable": 0}

    @settings(FUZZ, max_examples=2000)
    @given(data=st.data(), method=st.sampled_from(["LoadBatch", "LoadBatch", "Handshake", "Info"]))
    def one(data: st.DataObject, method: str) -> None:
        body = data.draw(bodies(valid[method]))
        try:
            reply = calls[method](body, timeout=HANG_S)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
            if code == grpc.StatusCode.INTERNAL and "deserializing" in details:
                tried["unparsable"] += 1
                return
            tried["refused"] += 1
            assert code.name in REFUSALS, (code, details)
            return
        tried["answered"] += 1
        check_response(method, reply)

    one()
    print(f"\nraw gRPC bodies: {tried}")
    assert sum(tried.values()) >= 2000
    # Every kind of outcome, often (how many are refused varies with the worker's load).
    assert min(tried.values()) >= 100
    assert_still_serves(served, channel)


@st.composite
def zmq_messages(draw: st.DrawFn, valid: dict[str, list[bytes]]) -> list[bytes]:
    """Frames of any count and content, and requests with a frame mutated, added or left out."""
    # Chosen from lists, which hypothesis samples evenly, to keep a fair share of good frames.
    if draw(st.sampled_from([True, False, False, False])):
        return draw(st.lists(st.binary(max_size=40), min_size=1, max_size=6))
    method = draw(st.sampled_from(sorted(valid)))
    good_id, good_method, good_body = draw(
        st.sampled_from(list(itertools.product([True] * 4 + [False], repeat=3)))
    )
    frames = [
        draw(st.binary(min_size=8, max_size=8) if good_id else st.binary(max_size=12)),
        method.encode() if good_method else draw(st.binary(max_size=12)),
        draw(st.sampled_from(valid[method]) if good_body else bodies(valid[method])),
    ]
    change = draw(st.sampled_from(["none"] * 4 + ["drop", "add"]))
    if change == "drop":
        del frames[draw(st.integers(0, 2))]
    elif change == "add":
        frames.insert(draw(st.integers(0, 3)), draw(st.binary(max_size=40)))
    return frames if frames else [b""]


def check_zmq_reply(reply: list[bytes]) -> str:
    """A reply is well framed: "ok" (its body parses) or an error with a worker refusal code."""
    assert len(reply) >= 3, reply
    assert len(reply[0]) == 8
    if reply[1] == zmq_frames.ERROR:
        assert len(reply) == 3
        error = wire.ErrorReply()
        error.ParseFromString(reply[2])
        assert error.code in REFUSALS, error
        return "refused"
    assert reply[1] == zmq_frames.OK, reply
    if len(reply) > 3:  # a batch: its head, then the frames of its payload
        decode_frames(reply[3:])
    else:
        assert len(reply) == 3
    return "answered"


def test_raw_zmq_messages_never_crash_the_worker(
    served: WorkerProcess, channel: grpc.Channel
) -> None:
    assert served.zmq is not None
    valid = valid_requests(served_fingerprints(channel))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(served.zmq.replace("zmq://", "tcp://", 1))
    probes = itertools.count(0xA5A5_0000_0000_0000)
    tried = {"messages": 0, "answered": 0, "refused": 0}

    def exchange(frames: list[bytes]) -> None:
        """Send `frames`, then an Info probe; handle every reply until the probe's."""
        socket.send_multipart(frames)
        probe = zmq_frames.request_frames(next(probes), wire.InfoRequest())
        socket.send_multipart(probe)
        while True:
            assert socket.poll(int(HANG_S * 1000)), "the worker stopped answering"
            reply = socket.recv_multipart()
            if reply[0] == probe[0]:
                assert reply[1] == zmq_frames.OK, reply
                return
            tried[check_zmq_reply(reply)] += 1

    try:

        @settings(FUZZ, max_examples=2000)
        @given(frames=zmq_messages(valid))
        def one(frames: list[bytes]) -> None:
            tried["messages"] += 1
            exchange(frames)

        one()
        # Replies that came after their probe are in by the time a last probe returns.
        exchange(zmq_frames.request_frames(1, wire.InfoRequest()))
        print(f"\nraw ZeroMQ messages: {tried}")
        assert tried["messages"] >= 2000
        assert min(tried["answered"], tried["refused"]) >= 200
        assert_still_serves(served, channel)
        good = wire.BatchRequest(
            pipeline="numbers",
            fingerprint=served_fingerprints(channel)["numbers"],
            plan=plan_to_wire(Plan(100, 8)),
            step=2,
        )
        socket.send_multipart(zmq_frames.request_frames(7, good))
        assert socket.poll(int(HANG_S * 1000))
        reply = zmq_frames.parse_batch_reply(socket.recv_multipart())
        assert reply.request_id == 7
        np.testing.assert_array_equal(decode_frames(reply.payload)["y"], 2 * np.arange(16, 24))
    finally:
        socket.close(linger=0)
        context.term()
