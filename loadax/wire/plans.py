"""Plans, work items and versions on the wire, shared by the worker and the client."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import numpy as np

from loadax.errors import WorkerError
from loadax.plan.blocks import BlockShuffle
from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan
from loadax.plan.segments import Position
from loadax.plan.work import MAX_POSITION, ListedWork, StepWork, StreamWindow, Work
from loadax.wire import checksum
from loadax.wire.limits import MAX_LISTED_ROWS
from loadax.wire.v1 import worker_pb2 as wire


def compatible_versions(client: str, worker: str) -> bool:
    """Client and worker must agree on the major and minor version."""
    return client.split(".")[:2] == worker.split(".")[:2]


def plan_to_wire(plan: Plan) -> wire.Plan:
    """The plan's parameters, as a worker rebuilds it. A length-bucketed plan travels without
    its buckets and its start (a worker has not the lengths): its requests name their records
    (`batch_request`), and the worker checks them against the dataset's length."""
    message = wire.Plan(
        num_records=plan.num_records,
        batch_size=plan.batch_size,
        seed=plan.seed,
        shuffle=plan.shuffle,
        drop_remainder=plan.drop_remainder,
    )
    if plan.num_epochs is not None:
        message.num_epochs = plan.num_epochs
    for step, size in plan.batch_size_changes:
        message.batch_size_changes.add(step=step, batch_size=size)
    if plan.first_position is not None and plan.buckets is None:
        message.start.CopyFrom(
            wire.PlanStart(
                step=plan.first_step,
                epoch=plan.first_position.epoch,
                delivered=plan.first_position.cursor,  # type: ignore[arg-type]  # a plain plan's
            )
        )
    if plan.blocks is not None:
        message.blocks.CopyFrom(
            wire.BlockShuffle(block_size=plan.blocks.block_size, window=plan.blocks.window)
        )
    return message


def plan_from_wire(message: wire.Plan, num_records: int | None = None) -> Plan:
    """The plan of a request; `num_records` overrides the message's (handshakes leave it 0)."""
    try:
        start = message.start if message.HasField("start") else None
        blocks = message.blocks if message.HasField("blocks") else None
        return Plan(
            num_records=message.num_records if num_records is None else num_records,
            batch_size=message.batch_size,
            seed=message.seed,
            shuffle=message.shuffle,
            num_epochs=message.num_epochs if message.HasField("num_epochs") else None,
            drop_remainder=message.drop_remainder,
            batch_size_changes=tuple(
                (change.step, change.batch_size) for change in message.batch_size_changes
            ),
            first_step=0 if start is None else start.step,
            first_position=None if start is None else Position(start.epoch, start.delivered),
            blocks=None if blocks is None else BlockShuffle(blocks.block_size, blocks.window),
        )
    except ValueError as error:
        raise WorkerError("INVALID_ARGUMENT", f"invalid plan: {error}") from error


def request_plan(message: wire.Plan) -> Plan:
    """The plan of a batch request (`plan_from_wire`), read once for the many requests that
    carry the same one: a loader's requests share their plan, and reading it (13 µs) costs more
    than the rest of a worker's checks of a request, or a client's of a reply. Plans are
    immutable, so one serves every thread; an invalid one raises as `plan_from_wire` does.

    >>> from loadax import Plan
    >>> from loadax.wire.plans import plan_to_wire, request_plan
    >>> sent = plan_to_wire(Plan(num_records=10, batch_size=4))
    >>> request_plan(sent) is request_plan(plan_to_wire(Plan(num_records=10, batch_size=4)))
    True
    >>> request_plan(sent).batch_length(2)
    2
    """
    return _plan_of(message.SerializeToString())


@functools.lru_cache(maxsize=64)
def _plan_of(serialized: bytes) -> Plan:
    return plan_from_wire(wire.Plan.FromString(serialized))


def batch_request(
    pipeline: str, fingerprint: str, plan: Plan, work: Work, client: str = ""
) -> wire.BatchRequest:
    """The request that asks a worker for `work` of `plan` from the named pipeline, on behalf of
    `client` (its id; empty: the worker tells clients apart by connection only). The rows of a
    length-bucketed plan's step travel with their records named (`StepWork.listed`).

    >>> import numpy as np
    >>> from loadax import Plan
    >>> from loadax.plan.buckets import LengthBuckets
    >>> from loadax.plan.work import StepWork
    >>> from loadax.wire.plans import batch_request
    >>> buckets = LengthBuckets([1, 9, 2, 8], boundaries=[5])
    >>> plan = Plan(num_records=4, batch_size=2, buckets=buckets)
    >>> request = batch_request("p", "f", plan, StepWork(0))
    >>> list(request.rows), np.frombuffer(request.records.indices, "<i8").tolist()
    ([0, 1], [0, 2])
    """
    if plan.buckets is not None and isinstance(work, StepWork):
        work = work.listed(plan)
    request = wire.BatchRequest(
        pipeline=pipeline,
        fingerprint=fingerprint,
        plan=plan_to_wire(plan),
        step=work.ordinal,
        client=client,
        checksum=checksum.PREFERRED,
    )
    if isinstance(work, StreamWindow):
        request.window.CopyFrom(
            wire.StreamWindow(shards=work.shards, shard=work.shard, index=work.index)
        )
    elif isinstance(work, StepWork) and work.rows is not None:
        request.rows.extend(work.rows.tolist())
    elif isinstance(work, ListedWork):
        request.rows.extend(work.rows.tolist())
        indices = work.indices.astype("<i8").tobytes()
        request.records.CopyFrom(wire.ListedRecords(indices=indices, epoch=work.epoch))
    return request


def request_digest(request: wire.BatchRequest) -> bytes:
    """16 bytes that name what `request` asks for: pipeline, fingerprint, plan, step, rows,
    window and the records it names. Computed from the fields, not the protobuf encoding (which
    may differ between implementations), so that the worker's digest of what it received is the
    client's of what it sent. A reply's header carries it; the client refuses a reply to another
    request. Who asks (`client`) is not part of it: the same request of two clients has one
    digest.

    >>> from loadax import Plan
    >>> from loadax.plan.work import StepWork
    >>> from loadax.wire.plans import batch_request, request_digest
    >>> plan = Plan(num_records=10, batch_size=4)
    >>> first = request_digest(batch_request("p", "f", plan, StepWork(0)))
    >>> len(first), first == request_digest(batch_request("p", "f", plan, StepWork(1)))
    (16, False)
    >>> first == request_digest(batch_request("p", "f", plan, StepWork(0), client="a1"))
    True
    """
    plan = request.plan
    window = request.window if request.HasField("window") else None
    fields: list[Any] = [
        request.pipeline,
        request.fingerprint,
        [plan.num_records, plan.batch_size, plan.seed, plan.shuffle, plan.drop_remainder],
        plan.num_epochs if plan.HasField("num_epochs") else None,
        request.step,
        None if window is None else [window.shards, window.shard, window.index],
        len(request.rows),
    ]
    if plan.batch_size_changes or plan.HasField("start"):  # absent: the digests of before
        start = plan.start
        fields.append([[change.step, change.batch_size] for change in plan.batch_size_changes])
        fields.append(
            [start.step, start.epoch, start.delivered] if plan.HasField("start") else None
        )
    if plan.HasField("blocks"):  # absent: the digests of before; a worker blind to it differs
        fields.append(["blocks", plan.blocks.block_size, plan.blocks.window])
    listed = request.records if request.HasField("records") else None
    if listed is not None:  # absent: the digests of before, which a worker without it computes
        fields.append(["records", listed.epoch, len(listed.indices)])
    digest = hashlib.blake2b(json.dumps(fields).encode(), digest_size=16)
    if request.rows:  # none adds no bytes: numpy is not asked to make an empty array
        digest.update(np.array(request.rows, dtype="<u8").tobytes())
    if listed is not None:
        digest.update(listed.indices)
    return digest.digest()


def work_from_wire(request: wire.BatchRequest) -> Work:
    """The work a request asks for; a malformed one is an INVALID_ARGUMENT `WorkerError`.

    Whether it lies within the plan is for `Work.check` to say.
    """
    if request.HasField("window"):
        if request.rows or request.HasField("records"):
            raise WorkerError("INVALID_ARGUMENT", "a window request has no rows nor records")
        shards, shard, index = request.window.shards, request.window.shard, request.window.index
        try:
            return StreamWindow(shards, shard, index)
        except ValueError as error:
            raise WorkerError(
                "INVALID_ARGUMENT", f"window {shards}/{shard}/{index}: {error}"
            ) from None
    if request.HasField("records"):
        return _listed(request)
    if not request.rows:
        return StepWork(request.step)
    return StepWork(request.step, _rows(request))


def _rows(request: wire.BatchRequest) -> IndexArray:
    """The request's rows, checked to ascend within a batch."""
    # Unsigned, as sent: positions of 2**63 and more must not wrap before they are checked.
    rows = np.array(request.rows, dtype=np.uint64)
    if np.any(rows[1:] <= rows[:-1]):
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"rows must ascend within the batch, got "
            f"{rows[:8].tolist()}{'...' if rows.size > 8 else ''}",
        )
    if rows[-1] >= MAX_POSITION:
        raise WorkerError("INVALID_ARGUMENT", f"rows must lie within the batch, got {rows[-1]}")
    return rows.astype(np.int64)


def _listed(request: wire.BatchRequest) -> ListedWork:
    """The rows of a request that names their records; whether the records lie within the
    dataset is for `ListedWork.check` to say."""
    indices, rows = request.records.indices, len(request.rows)
    if len(indices) % 8:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"a request's records are little-endian int64s, 8 bytes each; got {len(indices)} bytes",
        )
    if len(indices) // 8 != rows or not rows:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"a request names one record per row, and some rows: it names "
            f"{len(indices) // 8} records for {rows} rows",
        )
    if rows > MAX_LISTED_ROWS:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"a request names the records of at most {MAX_LISTED_ROWS} rows, got {rows}",
        )
    records = np.frombuffer(indices, dtype="<i8").astype(np.int64)
    return ListedWork(request.step, _rows(request), records, request.records.epoch)
