"""A pipeline's identity: a digest of what it does, equal wherever the same code and config run.

It covers the config's factory and args, the source of the factory's module, the code of every
callable the pipeline holds (through closures, partials, callable objects, classes and the
module-level names they use) and a probe: the encoded output of one small canonical piece of work,
so that the same code over other data is another identity. Nothing in it is a memory address, a
`hash()` or the iteration order of a set, so two processes, two hosts or a restart agree.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadax.execution.executor import Executor
from loadax.execution.pipeline import Pipeline
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork, StreamWindow, Work
from loadax.server.code_walk import Walker
from loadax.server.digests import hashed
from loadax.wire.codec import encode_frames

log = logging.getLogger(__name__)

VERSION = b"loadax pipeline identity 1"
"""Changes whenever what goes into an identity does, so that old and new digests never match."""

PROBE_ROWS = 4
"""The rows of the probe batch of a random-access pipeline (a stream's probe is window 0)."""


def pipeline_identity(
    name: str,
    pipeline: Pipeline[Any, Any],
    origin: Mapping[str, Any] | None = None,
    *,
    executor: Executor[Any] | None = None,
) -> str:
    """The identity (64 hex digits) of pipeline `name`, built as `origin` says.

    `origin` is what the config says (`{"factory": "module:function", "args": {...}}`); the
    factory's module source and code count only when it names one. The probe runs on `executor`
    (default: in this thread). The walk of the code runs before the probe, so that nothing the
    probe caches counts.

    >>> from loadax import Batcher, Pipeline, RangeDataset
    >>> def doubled():
    ...     return Pipeline(RangeDataset(0, 8).map(lambda x: 2 * x), Batcher())
    >>> pipeline_identity("p", doubled()) == pipeline_identity("p", doubled())
    True
    >>> tripled = Pipeline(RangeDataset(0, 8).map(lambda x: 3 * x), Batcher())
    >>> pipeline_identity("p", doubled()) == pipeline_identity("p", tripled)
    False
    """
    origin = dict(origin or {})
    factory = _factory(name, origin.get("factory"))
    walker = Walker(None if factory is None else factory[0].__name__.partition(".")[0])
    parts = [
        walker.digest(name),
        walker.digest(origin),
        walker.digest(None) if factory is None else _source(factory[0]),
        walker.digest(None if factory is None else factory[1]),
        walker.digest((pipeline.num_records, pipeline.window)),
        walker.digest(pipeline),
    ]
    parts.append(probe_digest(name, pipeline, executor))
    return hashed(VERSION, *parts).hex()


def probe_digest(
    name: str, pipeline: Pipeline[Any, Any], executor: Executor[Any] | None = None
) -> bytes:
    """The digest of the encoded output of the pipeline's canonical work: the first batch of
    `PROBE_ROWS` rows, or window 0 of a stream's only shard. A pipeline of no records has no
    probe; one whose probe fails is named by the type of the failure, logged."""
    num_records = pipeline.num_records
    if not num_records:
        return hashed(b"no probe")
    plan = Plan(num_records, batch_size=min(PROBE_ROWS, num_records))
    work: Work = StepWork(0) if pipeline.stream is None else StreamWindow(1, 0, 0)
    try:
        output = (
            pipeline.run(plan, work) if executor is None else executor.submit(plan, work).result()
        )
        frames = encode_frames(output)
    except Exception as error:  # the worker still starts: its requests fail as the probe did
        log.warning("pipeline %r: the probe of its identity failed: %r", name, error)
        kind = type(error)
        return hashed(b"probe failed", f"{kind.__module__}.{kind.__qualname__}".encode())
    digest = hashlib.sha256(b"probe")
    for frame in frames:
        view = memoryview(frame)
        digest.update(view.nbytes.to_bytes(8, "little"))
        digest.update(view)
    return digest.digest()


def _factory(name: str, factory: Any) -> tuple[types.ModuleType, Any] | None:
    """The module and the callable that a "module:function" origin names (None: none named)."""
    if factory is None:
        return None
    module_name, colon, attributes = (
        factory.partition(":") if isinstance(factory, str) else ("", "", "")
    )
    if not (colon and module_name and attributes):
        raise ValueError(
            f'the origin of pipeline {name!r} must name its factory as "module:function", '
            f"got {factory!r}"
        )
    try:
        module = importlib.import_module(module_name)
        target: Any = module
        for attribute in attributes.split("."):
            target = getattr(target, attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"the origin of pipeline {name!r} names factory {factory!r}, which cannot be "
            f"imported: {error}"
        ) from error
    return module, target


def _source(module: types.ModuleType) -> bytes:
    """The digest of the source file of `module` (of a marker when it has none)."""
    file = getattr(module, "__file__", None)
    if isinstance(file, str) and file.endswith(".py") and os.path.isfile(file):
        return hashed(b"source", Path(file).read_bytes())
    return hashed(b"no source")
