"""Plans, work items and versions on the wire, shared by the worker and the client."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from loadax.errors import WorkerError
from loadax.plan.planner import Plan
from loadax.plan.segments import Position
from loadax.plan.work import MAX_POSITION, StepWork, StreamWindow, Work
from loadax.wire import checksum
from loadax.wire.v1 import worker_pb2 as wire


def compatible_versions(client: str, worker: str) -> bool:
    """Client and worker must agree on the major and minor version."""
    return client.split(".")[:2] == worker.split(".")[:2]


def plan_to_wire(plan: Plan) -> wire.Plan:
    """The plan's parameters, as a worker rebuilds it: a length-bucketed plan cannot travel
    (a worker has not its lengths), and a remote loader refuses one when it is built."""
    if plan.buckets is not None:
        raise ValueError("a length-bucketed plan cannot be sent to workers")
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
    if plan.first_position is not None:
        message.start.CopyFrom(
            wire.PlanStart(
                step=plan.first_step,
                epoch=plan.first_position.epoch,
                delivered=plan.first_position.cursor,  # type: ignore[arg-type]  # a plain plan's
            )
        )
    return message


def plan_from_wire(message: wire.Plan, num_records: int | None = None) -> Plan:
    """The plan of a request; `num_records` overrides the message's (handshakes leave it 0)."""
    try:
        start = message.start if message.HasField("start") else None
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
        )
    except ValueError as error:
        raise WorkerError("INVALID_ARGUMENT", f"invalid plan: {error}") from error


def batch_request(
    pipeline: str, fingerprint: str, plan: Plan, work: Work, client: str = ""
) -> wire.BatchRequest:
    """The request that asks a worker for `work` of `plan` from the named pipeline, on behalf of
    `client` (its id; empty: the worker tells clients apart by connection only)."""
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
    return request


def request_digest(request: wire.BatchRequest) -> bytes:
    """16 bytes that name what `request` asks for: pipeline, fingerprint, plan, step, rows and
    window. Computed from the fields, not the protobuf encoding (which may differ between
    implementations), so that the worker's digest of what it received is the client's of what
    it sent. A reply's header carries it; the client refuses a reply to another request. Who
    asks (`client`) is not part of it: the same request of two clients has one digest.

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
    digest = hashlib.blake2b(json.dumps(fields).encode(), digest_size=16)
    digest.update(np.array(request.rows, dtype="<u8").tobytes())
    return digest.digest()


def work_from_wire(request: wire.BatchRequest) -> Work:
    """The work a request asks for; a malformed one is an INVALID_ARGUMENT `WorkerError`.

    Whether it lies within the plan is for `Work.check` to say.
    """
    if request.HasField("window"):
        if request.rows:
            raise WorkerError("INVALID_ARGUMENT", "a window request has no rows")
        shards, shard, index = request.window.shards, request.window.shard, request.window.index
        try:
            return StreamWindow(shards, shard, index)
        except ValueError as error:
            raise WorkerError(
                "INVALID_ARGUMENT", f"window {shards}/{shard}/{index}: {error}"
            ) from None
    if not request.rows:
        return StepWork(request.step)
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
    return StepWork(request.step, rows.astype(np.int64))
