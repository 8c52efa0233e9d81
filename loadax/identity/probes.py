"""The probe batches a worker or a client's local member makes of a pipeline as it starts: the
schema of its batches, announced in handshakes, and the encoded bytes per row a worker's memory
budget starts from."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from loadax.execution.pipeline import Pipeline
from loadax.logfields import fields
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork, StreamWindow
from loadax.wire.codec import decode_frames, encode_frames
from loadax.wire.schema import batch_schema
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)


def probe_batches(
    name: str, pipeline: Pipeline[Any, Any]
) -> tuple[wire.BatchSchema | None, list[tuple[int, int]]]:
    """The schema of the pipeline's batches, from probes that go through the codec as replies
    do (the first row and the first two rows of a batch, window 0 of a stream), and the encoded
    bytes of each batch probe by its rows. No schema, logged, when the pipeline cannot make a
    probe: clients then check batches without one."""
    num_records = pipeline.num_records
    if not num_records:
        return None, []  # no batch to check
    sizes: list[tuple[int, int]] = []
    try:
        if pipeline.stream is not None:
            plan = Plan(num_records, batch_size=1)
            window = _round_trip(pipeline.run(plan, StreamWindow(shards=1, shard=0, index=0)))
            if window is None:
                raise ValueError("no row of window 0 survives")
            probes: list[tuple[Any, int | None]] = [(window, None)]
        else:
            plan = Plan(num_records, batch_size=min(num_records, 2))
            probes = []
            for rows in sorted({1, plan.batch_length(0)}):
                frames = encode_frames(pipeline.run(plan, StepWork(0, np.arange(rows))))
                sizes.append((rows, sum(len(frame) for frame in frames)))
                probes.append((decode_frames(frames), rows))
    except Exception as error:
        log.warning(
            "pipeline %r has no batch schema: its probe batch failed: %r",
            name,
            error,
            extra=fields(event="probe_failed", pipeline=name, error=error),
        )
        return None, []
    schema = batch_schema(probes)
    if schema is None:
        log.warning(
            "pipeline %r has no batch schema: its probe batches differ in tree",
            name,
            extra=fields(event="probe_failed", pipeline=name, error="probe batches differ in tree"),
        )
    return schema, sizes


def _round_trip(batch: Any) -> Any:
    """`batch` as a client decodes it."""
    return decode_frames(encode_frames(batch))
