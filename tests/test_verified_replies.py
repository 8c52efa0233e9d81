"""Every reply is verified before the training loop sees it, over gRPC, ZeroMQ and in-process;
a failing record is a `RecordError` in every mode.

Replies are corrupted between the transport and the client's check (`ReplyDecoder.verify`), by
rewriting what a real worker sent (its real encoded frames): a flipped byte, another step's
reply, a cut payload, junk, or a batch of the wrong shape sent with a header that matches it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import numpy as np
import pipelines
import pytest
from helpers import assert_batches_equal
from hypothesis import given, settings
from hypothesis import strategies as st
from verifying import Verifying
from workers import WorkerProcess, worker_process

import loadax
from loadax import Batcher, DataLoader, Plan, RecordError
from loadax.client import RemoteDataLoader
from loadax.client.replies import ReplyDecoder
from loadax.client.transports import Reply as Received
from loadax.client.transports import Transport
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.in_process import InProcessTransport
from loadax.client.transports.reply import bad_reply
from loadax.client.transports.zmq import ZmqTransport
from loadax.errors import RemoteCause, WorkerError
from loadax.plan.work import StepWork, StreamWindow
from loadax.server.worker import Worker
from loadax.wire.checksum import payload_checksum
from loadax.wire.codec import decode_frames, encode_frames
from loadax.wire.payloads import (
    EncodedBatch,
    MalformedReply,
    parse_payload_reply,
    payload_reply,
    read_stream,
    stream_messages,
)
from loadax.wire.plans import batch_request, plan_to_wire, request_digest
from loadax.wire.schema import batch_schema, schema_difference
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 30.0
SERVED = """
[pipelines.numbers]
factory = "pipelines:numbers"
args = { records = 30 }

[pipelines.failing]
factory = "pipelines:failing"
args = { records = 20, bad = 7 }
"""
PLAN = Plan(30, batch_size=4, seed=3, shuffle=True, num_epochs=2)
FAILING_PLAN = Plan(20, batch_size=4, seed=3, shuffle=True, num_epochs=2)
Reply = tuple[wire.BatchResponse, list[bytes]]
"""What a worker sent for a batch: its header and the frames of its payload."""
Tamper = Callable[[wire.BatchRequest, Reply], Reply]


# --- transports whose replies are rewritten before the check ------------------------------------


class Tampering(Verifying[Transport]):
    """Keeps the last reply as received (`seen`) and, with a `tamper`, hands the decoder's check
    `tamper(request, reply)` instead."""

    tamper: Tamper | None = None
    seen: Reply | None = None

    def verify(self, request: wire.BatchRequest, reply: Future[Received], timeout: float) -> Any:
        wait([reply], timeout)
        if reply.done() and not reply.cancelled() and reply.exception() is None:
            header, payload = reply.result()[:2]
            self.seen = (header, [bytes(part) for part in payload])
            if self.tamper is not None:
                reply = Future()
                reply.set_result(Received(*self.tamper(request, self.seen)))
        return super().verify(request, reply, timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("served"), SERVED, zmq=True) as worker:
        yield worker


@pytest.fixture(scope="module")
def in_process() -> Iterator[Worker]:
    worker = Worker({"numbers": pipelines.numbers(30), "failing": pipelines.failing(20, 7)})
    yield worker
    worker.close()


TRANSPORTS = ["grpc", "zmq", "in-process"]


@pytest.fixture(params=TRANSPORTS)
def target(
    request: pytest.FixtureRequest, served: WorkerProcess, in_process: Worker
) -> Iterator[Any]:
    """A tampering transport of each kind, on the worker process or the worker object."""
    made: Transport
    if request.param == "grpc":
        assert served.grpc is not None
        made = GrpcTransport(served.grpc)
    elif request.param == "zmq":
        assert served.zmq is not None
        made = ZmqTransport(served.zmq)
    else:
        made = InProcessTransport(in_process)
    try:
        yield Tampering(made)
    finally:
        made.close()


def handshake(target: Verifying[Any], pipeline: str = "numbers") -> wire.HandshakeResponse:
    request = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(PLAN)
    )
    return target.handshake(request, timeout=WAIT_S)


def request_of(
    target: Verifying[Any], step: int, rows: list[int] | None = None
) -> wire.BatchRequest:
    fingerprint = handshake(target).fingerprint
    work = StepWork(step, None if rows is None else np.array(rows))
    return batch_request("numbers", fingerprint, PLAN, work)


def load(target: Verifying[Any], request: wire.BatchRequest) -> Any:
    return target.load(request, WAIT_S)


def refusal(target: Verifying[Any], request: wire.BatchRequest) -> WorkerError:
    with pytest.raises(WorkerError) as refused:
        load(target, request)
    assert refused.value.code == "DATA_LOSS", refused.value
    assert target.name in refused.value.message
    return refused.value


# --- what a corrupted reply looks like, each with the check that catches it ---------------------


def forged(request: wire.BatchRequest, header: wire.BatchResponse, batch: Any) -> Reply:
    """`batch`, encoded, with a header that matches it (what a buggy worker would send)."""
    frames = encode_frames(batch)
    answer = EncodedBatch.answering(request, header.fingerprint, frames)
    return answer.header, [bytes(frame) for frame in frames]


def flip_a_byte(request: wire.BatchRequest, reply: Reply) -> Reply:
    header, frames = reply
    payload = bytearray(b"".join(frames))
    payload[-9] ^= 0x01  # inside the last array
    return header, [bytes(payload)]


def cut_the_last_leaf(request: wire.BatchRequest, reply: Reply) -> Reply:
    header, frames = reply
    return header, [b"".join(frames)[:-8]]


def junk_with_its_checksum(request: wire.BatchRequest, reply: Reply) -> Reply:
    header, _ = reply
    junk = bytes(range(256)) * 4
    forged_header = EncodedBatch.answering(request, header.fingerprint, [junk]).header
    return forged_header, [junk]


def another_identity(request: wire.BatchRequest, reply: Reply) -> Reply:
    header, frames = reply
    other = wire.BatchResponse()
    other.CopyFrom(header)
    other.fingerprint = "0" * 64
    return other, frames


def one_row_less(request: wire.BatchRequest, reply: Reply) -> Reply:
    batch = decode_frames(reply[1])
    return forged(request, reply[0], {key: leaf[:-1] for key, leaf in batch.items()})


def another_dtype(request: wire.BatchRequest, reply: Reply) -> Reply:
    batch = decode_frames(reply[1])
    return forged(request, reply[0], {**batch, "y": batch["y"].astype(np.int64)})


def an_extra_leaf(request: wire.BatchRequest, reply: Reply) -> Reply:
    batch = decode_frames(reply[1])
    return forged(request, reply[0], {**batch, "z": np.zeros(len(batch["y"]))})


def another_ndim(request: wire.BatchRequest, reply: Reply) -> Reply:
    batch = decode_frames(reply[1])
    return forged(request, reply[0], {**batch, "x": batch["x"][:, :, None]})


CORRUPTIONS: dict[str, tuple[Tamper, str]] = {
    "a flipped byte": (flip_a_byte, r"its payload's checksum is [0-9a-f]{16}, its header says"),
    "a cut leaf": (cut_the_last_leaf, r"its payload has \d+ bytes, its header says \d+"),
    "junk with its checksum": (junk_with_its_checksum, "its payload does not decode: "),
    "another identity": (another_identity, "it was made by pipeline identity 000000000000"),
    "a row less": (one_row_less, r"leaf \['x'\] has 3 rows, the request asked for 4"),
    "another dtype": (another_dtype, r"leaf \['y'\] has dtype <i8, the schema says <i4"),
    "an extra leaf": (an_extra_leaf, r"its tree is \{'x': \*, 'y': \*, 'z': \*\}"),
    "another ndim": (another_ndim, r"leaf \['x'\] has 3 dimensions, the schema says 2"),
}


def test_a_correct_reply_passes_and_is_the_local_batch(target: Any) -> None:
    for step, rows in ((0, None), (5, [1, 3]), (7, None)):
        batch = load(target, request_of(target, step, rows))
        assert_batches_equal([batch], [pipelines.numbers(30).load(PLAN, step, rows)])


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupted_reply_is_data_loss_naming_what_differed(target: Any, corruption: str) -> None:
    tamper, difference = CORRUPTIONS[corruption]
    request = request_of(target, 2)
    target.tamper = tamper
    error = refusal(target, request)
    assert re.search(f"sent a bad reply to step 2: {difference}", error.message), error.message
    target.tamper = None
    load(target, request)  # the same request, untouched, passes


def sent(target: Any, request: wire.BatchRequest) -> Reply:
    """What the worker sent for `request`, as the target received it."""
    load(target, request)
    assert target.seen is not None
    reply: Reply = target.seen
    return reply


def test_another_steps_reply_is_refused_by_its_request_digest(target: Any) -> None:
    step_3 = sent(target, request_of(target, 3))
    target.tamper = lambda request, reply: step_3
    error = refusal(target, request_of(target, 2))
    assert "it answers another request (of step 3)" in error.message
    # Other rows of the same step are another request too.
    target.tamper = None
    rows_0_1 = sent(target, request_of(target, 2, rows=[0, 1]))
    target.tamper = lambda request, reply: rows_0_1
    error = refusal(target, request_of(target, 2, rows=[0, 2]))
    assert "it answers another request (of step 2)" in error.message


def test_rows_asked_for_are_the_rows_checked(target: Any) -> None:
    request = request_of(target, 4, rows=[0, 2, 3])
    target.tamper = one_row_less
    error = refusal(target, request)
    assert "leaf ['x'] has 2 rows, the request asked for 3" in error.message


# --- the checks themselves ----------------------------------------------------------------------


def test_the_checksum_does_not_depend_on_how_the_payload_is_framed() -> None:
    payload = np.random.default_rng(0).bytes(3 * 8192 + 77)
    whole = payload_checksum([payload])
    for cuts in ([1], [8191, 8192, 8193], [5000, 5001, 20000], [24653]):
        frames = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
        assert payload_checksum(frames) == whole
    assert payload_checksum([payload + b"\0"]) != whole  # the length counts


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_change_of_a_byte_or_a_swap_of_two_words_changes_the_checksum(
    data: st.DataObject,
) -> None:
    labels = np.arange(64, dtype=np.int64)  # one 512-byte leaf: inside one block
    payload = b"".join(encode_frames({"label": labels, "x": np.ones((64, 300), np.float32)}))
    reference = payload_checksum([payload])
    changed = bytearray(payload)
    if data.draw(st.booleans(), label="swap"):
        a, b = data.draw(st.lists(st.integers(0, 63), min_size=2, max_size=2, unique=True))
        swapped = labels.copy()
        swapped[[a, b]] = swapped[[b, a]]
        changed = bytearray(
            b"".join(encode_frames({"label": swapped, "x": np.ones((64, 300), np.float32)}))
        )
    else:
        position = data.draw(st.integers(0, len(payload) - 1), label="position")
        changed[position] ^= data.draw(st.integers(1, 255), label="xor")
    assert payload_checksum([bytes(changed)]) != reference


def test_the_request_digest_covers_every_field() -> None:
    base = batch_request("numbers", "f" * 64, PLAN, StepWork(2, np.array([0, 1])))
    digests = {request_digest(base)}
    for change in (
        lambda r: setattr(r, "pipeline", "other"),
        lambda r: setattr(r, "fingerprint", "e" * 64),
        lambda r: setattr(r, "step", 3),
        lambda r: r.rows.append(3),
        lambda r: setattr(r.plan, "seed", 4),
        lambda r: setattr(r.plan, "shuffle", False),
        lambda r: setattr(r.plan, "num_epochs", 3),
        lambda r: r.plan.ClearField("num_epochs"),
        lambda r: setattr(r.plan, "drop_remainder", True),
        lambda r: setattr(r.plan, "batch_size", 8),
        lambda r: r.window.CopyFrom(wire.StreamWindow(shards=1, shard=0, index=0)),
    ):
        changed = wire.BatchRequest()
        changed.CopyFrom(base)
        change(changed)
        digests.add(request_digest(changed))
    assert len(digests) == 12
    # Fields, not bytes: a request parsed from the wire has the digest of the one sent.
    assert request_digest(wire.BatchRequest.FromString(base.SerializeToString())) == (
        request_digest(base)
    )


def test_the_handshake_announces_the_schema_of_a_probe_batch(in_process: Worker) -> None:
    target = Verifying(InProcessTransport(in_process))
    try:
        schema = handshake(target).schema
    finally:
        target.close()
    assert schema.tree == "{'x': *, 'y': *}"
    assert [(leaf.dtype, leaf.ndim, leaf.rows_first) for leaf in schema.leaves] == [
        ("<i8", 2, True),
        ("<i4", 1, True),
    ]


def test_a_schema_leaves_out_what_varies_between_batches() -> None:
    def probe(rows: int, width: int) -> tuple[Any, int]:
        batch = {
            "tokens": np.zeros((rows, width), np.int32),  # padded to the longest row
            "text": np.array(["a" * width] * rows),  # as wide as the longest string
            "mean": np.float32(0.5),  # one value per batch
            "rows": [b"x" * width] * rows,  # a list per row
        }
        return decode_frames(encode_frames(batch)), rows

    schema = batch_schema([probe(1, 3), probe(2, 5)])
    assert schema is not None
    assert schema.tree == "{'mean': *, 'rows': [*, ...], 'text': *, 'tokens': *}"
    assert [(leaf.dtype, leaf.rows_first) for leaf in schema.leaves] == [
        ("<f4", False),
        ("bytes", False),
        ("<U", True),
        ("<i4", True),
    ]
    assert schema_difference(probe(4, 9)[0], schema, rows=4) is None
    assert schema_difference(probe(4, 9)[0], schema, rows=3) == (
        "leaf ['text'] has 4 rows, the request asked for 3"
    )


def test_a_window_may_be_none_and_its_rows_vary() -> None:
    schema = batch_schema([({"x": np.zeros((3, 2))}, None)])
    assert schema is not None
    assert not schema.leaves[0].rows_first
    decoder = ReplyDecoder("worker-a")
    decoder.learn(wire.HandshakeResponse(pipeline="odd", fingerprint="f", schema=schema))
    window = batch_request("odd", "f", PLAN, StreamWindow(shards=2, shard=1, index=4))
    for batch in (None, {"x": np.zeros((5, 2))}, {"x": np.zeros((1, 2))}):
        answer = EncodedBatch.answering(window, "f", encode_frames(batch))
        decoded = decoder.decode(window, answer.header, answer.frames)
        assert (decoded is None) == (batch is None)
    answer = EncodedBatch.answering(window, "f", encode_frames({"x": np.zeros((5, 2), np.int8)}))
    with pytest.raises(WorkerError, match="to window 4 of data shard 1 of 2: leaf") as refused:
        decoder.decode(window, answer.header, answer.frames)
    assert refused.value.code == "DATA_LOSS"


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_mutated_raw_grpc_reply_is_refused_as_data_loss_never_anything_else(
    data: st.DataObject,
) -> None:
    request = batch_request("numbers", "f" * 64, PLAN, StepWork(1))
    batch = pipelines.numbers(30).load(PLAN, 1)
    answer = EncodedBatch.answering(request, "f" * 64, encode_frames(batch))
    if data.draw(st.booleans(), label="streamed"):
        messages = [bytearray(message) for message in stream_messages(answer, chunk=64)]
    else:
        messages = [bytearray(payload_reply(answer.header, answer.frames))]
    for _ in range(data.draw(st.integers(1, 4))):
        message = data.draw(st.sampled_from(messages))
        if message:
            message[data.draw(st.integers(0, len(message) - 1))] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(messages)))
    kept = messages[:cut] + messages[cut + data.draw(st.integers(0, 1)) :]  # one dropped, maybe
    if len(messages) == 1 and kept:  # one reply: cut it short instead
        kept = [messages[0][: data.draw(st.integers(0, len(messages[0])))]]
    outcome = _decoded(request, [bytes(message) for message in kept], len(messages) > 1)
    if isinstance(outcome, WorkerError):
        assert outcome.code == "DATA_LOSS"
    else:  # only changes the checks do not cover: header fields that say nothing, padding
        assert_batches_equal([outcome], [batch])


def _decoded(request: wire.BatchRequest, messages: list[bytes], streamed: bool) -> Any:
    """The batch that a raw gRPC reply of `messages` brings, or the error that refuses it."""
    replies = ReplyDecoder("worker-a")
    try:
        if streamed:
            header, payload = read_stream(messages, lambda size: memoryview(bytearray(size)))
        else:
            header, view = parse_payload_reply(messages[0] if messages else b"")
            payload = [view]
        return replies.decode(request, header, payload)
    except MalformedReply as error:  # as the gRPC transport refuses it
        return bad_reply("worker-a", request, str(error))
    except WorkerError as error:
        return error


# --- a failing record is a RecordError in every mode --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Failure:
    index: int
    epoch: int
    text: str


def failure_of(loader: Any) -> tuple[RecordError, Failure]:
    with pytest.raises(RecordError) as raised:
        for _ in loader:
            pass
    error = raised.value
    return error, Failure(error.index, error.epoch, str(error))


@pytest.fixture(scope="module")
def local_failure() -> Failure:
    pipeline = pipelines.failing(20, 7)
    loader = (DataLoader(Batcher()).batch_size(4).shuffle(seed=3).num_epochs(2).workers(2)).build(
        pipeline.dataset
    )
    error, failure = failure_of(loader)
    assert isinstance(error.__cause__, ValueError)
    assert failure.text == "record 7 (epoch 0) failed: ValueError: record 7 is corrupt"
    return failure


def remote_failure(target: Any) -> tuple[RecordError, Failure]:
    builder = (
        RemoteDataLoader([target], pipeline="failing")
        .batch_size(4)
        .shuffle(seed=3)
        .num_epochs(2)
        .no_worker_timeout(WAIT_S)
    )
    with builder.build() as loader:
        return failure_of(loader)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failing_record_is_a_record_error_in_every_mode(
    transport: str, served: WorkerProcess, in_process: Worker, local_failure: Failure
) -> None:
    spec = {"grpc": served.grpc, "zmq": served.zmq, "in-process": in_process}[transport]
    error, failure = remote_failure(spec)
    assert failure == local_failure
    cause = error.__cause__
    assert isinstance(cause, RemoteCause)
    assert (cause.type_name, str(cause)) == ("ValueError", "record 7 is corrupt")
    (note,) = error.__notes__
    name = spec if isinstance(spec, str) else "in-process Worker"
    assert note.startswith(f"loadax: raised on {name}; the traceback there:\nTraceback")
    assert "ValueError: record 7 is corrupt" in note


def test_verify_raises_the_record_error_itself(in_process: Worker) -> None:
    """So that the dispatcher can tell it apart (`isinstance(error, RecordError)`): no worker
    is asked again for a record that fails on every worker."""
    target = Verifying(InProcessTransport(in_process))
    try:
        fingerprint = handshake(target, "failing").fingerprint
        (step,) = [s for s in range(5) if 7 in FAILING_PLAN.indices(s).tolist()]
        request = batch_request("failing", fingerprint, FAILING_PLAN, StepWork(step))
        with pytest.raises(RecordError) as raised:
            target.load(request, WAIT_S)
    finally:
        target.close()
    assert (raised.value.index, raised.value.epoch) == (7, 0)


# --- what it costs ------------------------------------------------------------------------------


def test_the_checksum_benchmark_reports_each_candidate(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "checksum_bench.py"
    out = tmp_path / "checksum.json"
    subprocess.run(
        [sys.executable, str(script), "--repeats", "2", "--batch-ms", "50", "--json", str(out)],
        check=True,
        capture_output=True,
        cwd=script.parent,
        timeout=300,
    )
    report = json.loads(out.read_text())
    assert report["batch_bytes"] > 38_000_000
    names = [result["name"] for result in report["results"]]
    assert names[0].startswith("loadax payload_checksum")
    assert "zlib.crc32" in names
    assert all(
        result["gb_per_s"] > 0 and result["share_of_batch"] > 0 for result in report["results"]
    )
