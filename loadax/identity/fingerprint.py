"""A pipeline's fingerprint: a digest of what it does, equal wherever the same pipeline runs.

It covers the code of every callable the pipeline holds (through closures, partials, callable
objects, classes and the module-level names they use) and a probe: the encoded output of one small
canonical piece of work, so that the same code over other data is another fingerprint. A local
loader and a worker compute it alike, so a checkpoint moves between them exactly when their
pipelines agree. Nothing in it is a memory address, a `hash()` or the iteration order of a set, so
two processes, two hosts or a restart agree.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from loadax.dataset.names import dataset_repr
from loadax.execution.executor import Executor
from loadax.execution.pipeline import Pipeline
from loadax.identity.code_walk import Walker
from loadax.identity.digests import hashed
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork, StreamWindow, Work
from loadax.wire.codec import encode_frames

log = logging.getLogger(__name__)

VERSION = b"loadax pipeline fingerprint 2"
"""Changes whenever what goes into a fingerprint does, so that old and new digests never match."""

SHORT_FINGERPRINT = 12
"""The hex digits of a fingerprint that messages show."""
PROBE_ROWS = 4
"""The rows of the probe batch of a random-access pipeline (a stream's probe is window 0)."""


def pipeline_fingerprint(
    pipeline: Pipeline[Any, Any], *, executor: Executor[Any] | None = None
) -> str:
    """The fingerprint (64 hex digits) of `pipeline`: its code and its probe.

    The probe runs on `executor` (default: in this thread). The walk of the code runs before
    the probe, so that nothing the probe caches counts.

    >>> from loadax import Batcher, Pipeline, RangeDataset
    >>> def doubled():
    ...     return Pipeline(RangeDataset(0, 8).map(lambda x: 2 * x), Batcher())
    >>> pipeline_fingerprint(doubled()) == pipeline_fingerprint(doubled())
    True
    >>> tripled = Pipeline(RangeDataset(0, 8).map(lambda x: 3 * x), Batcher())
    >>> pipeline_fingerprint(doubled()) == pipeline_fingerprint(tripled)
    False
    """
    walker = Walker()
    code = (walker.digest((pipeline.num_records, pipeline.window)), walker.digest(pipeline))
    return hashed(VERSION, *code, probe_digest(pipeline, executor)).hex()


def probe_frames(
    pipeline: Pipeline[Any, Any], executor: Executor[Any] | None = None
) -> list[bytes | memoryview] | None:
    """The encoded output of the pipeline's canonical work: the first batch of `PROBE_ROWS`
    rows, or window 0 of a stream's only shard (None: a pipeline of no records has none).
    Whatever the pipeline raises, it raises."""
    num_records = pipeline.num_records
    if not num_records:
        return None
    plan = Plan(num_records, batch_size=min(PROBE_ROWS, num_records))
    work: Work = StepWork(0) if pipeline.stream is None else StreamWindow(1, 0, 0)
    output = pipeline.run(plan, work) if executor is None else executor.submit(plan, work).result()
    return encode_frames(output)


def probe_digest(pipeline: Pipeline[Any, Any], executor: Executor[Any] | None = None) -> bytes:
    """The digest of `probe_frames`. A probe that fails is named by the type of the failure,
    logged: a worker still starts, and its requests fail as the probe did."""
    try:
        frames = probe_frames(pipeline, executor)
    except Exception as error:
        log.warning(
            "the pipeline of %s: the probe of its fingerprint failed: %r",
            dataset_repr(pipeline.dataset),
            error,
        )
        kind = type(error)
        return hashed(b"probe failed", f"{kind.__module__}.{kind.__qualname__}".encode())
    if frames is None:
        return hashed(b"no probe")
    digest = hashlib.sha256(b"probe")
    for frame in frames:
        view = memoryview(frame)
        digest.update(view.nbytes.to_bytes(8, "little"))
        digest.update(view)
    return digest.digest()
