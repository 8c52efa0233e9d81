"""`RemoteDataLoader`: the local loader's builder and iterator, with batches made by workers.

The client sends plan parameters, step numbers and rows, never code. Steps are spread over the
targets; the shared `BatchIterator` keeps `prefetch` requests in flight and yields batches in
step order, so the batches and the checkpoint state are exactly the local loader's.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Self

import loadax
from loadax.client.targets import Target, TargetSpec, connect
from loadax.engine import BatchSource, FuturePending, Pending
from loadax.loader import DEFAULT_PREFETCH, Loader, LoaderBuilder, LoaderOptions
from loadax.permutation import IndexArray
from loadax.plan import Plan
from loadax.wire.plans import compatible_versions, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire


class RemoteDataLoader(LoaderBuilder):
    """Builds a loader whose batches are made by workers:

    `RemoteDataLoader(["grpc://host:50051"], pipeline="images").batch_size(256).build()`
    """

    def __init__(self, targets: Sequence[TargetSpec], pipeline: str) -> None:
        super().__init__()
        if isinstance(targets, str) or not targets:
            raise ValueError("targets must be a non-empty list of addresses or worker objects")
        if not isinstance(pipeline, str) or not pipeline:
            raise ValueError(f"pipeline must be a pipeline name, got {pipeline!r}")
        self._targets, self._pipeline = list(targets), pipeline

    def prefetch(self, batches: int) -> Self:
        """Requests in flight ahead of the training loop. Default 2."""
        return self._with(prefetch=batches)

    def build(self) -> RemoteLoader:
        """Connect and handshake with every target; the dataset's length comes from them."""
        targets = [connect(spec) for spec in self._targets]
        try:
            return RemoteLoader(targets, self._pipeline, self._options)
        except BaseException:
            for target in targets:
                target.close()
            raise


class RemoteLoader(Loader[Any]):
    """A loader definition served by workers; `close()` (or collection) closes the connections."""

    def __init__(self, targets: list[Target], pipeline: str, options: LoaderOptions) -> None:
        fingerprint, num_records = _handshake(targets, pipeline, options.plan(1))
        plan = options.plan(num_records)
        self.targets = targets

        def source() -> BatchSource[Any]:
            return RemoteSource(targets, pipeline, fingerprint)

        super().__init__(plan, options, source, prefetch=options.prefetch or DEFAULT_PREFETCH)
        self._finalizer = weakref.finalize(self, _close_all, targets)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RemoteSource(BatchSource[Any]):
    """Sends the request of step `s` to target `s mod n`: every target serves every n-th step."""

    def __init__(self, targets: Sequence[Target], pipeline: str, fingerprint: str) -> None:
        self._targets, self._pipeline, self._fingerprint = targets, pipeline, fingerprint

    def submit(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[Any]:
        request = wire.BatchRequest(
            pipeline=self._pipeline,
            fingerprint=self._fingerprint,
            plan=plan_to_wire(plan),
            step=step,
            rows=[] if rows is None else rows.tolist(),
        )
        return FuturePending(self._targets[step % len(self._targets)].load_batch(request))

    def release(self, wait: bool) -> None:
        """The connections belong to the loader, not to one iterator."""


def _handshake(targets: Sequence[Target], pipeline: str, plan: Plan) -> tuple[str, int]:
    """The fingerprint and length every target agrees on, or a ValueError naming both sides."""
    request = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(plan)
    )
    answers = [(target, target.handshake(request)) for target in targets]
    first_target, first = answers[0]
    for target, answer in answers:
        if not compatible_versions(answer.library_version, loadax.__version__):
            raise ValueError(
                f"{target.name} runs loadax {answer.library_version}, this client "
                f"{loadax.__version__}: major and minor versions must match"
            )
        if (answer.fingerprint, answer.num_records) != (first.fingerprint, first.num_records):
            raise ValueError(
                f"pipeline {pipeline!r} differs between workers: {first_target.name} has "
                f"fingerprint {first.fingerprint[:12]} and {first.num_records} records, "
                f"{target.name} has {answer.fingerprint[:12]} and {answer.num_records}"
            )
    return first.fingerprint, first.num_records


def _close_all(targets: Sequence[Target]) -> None:
    for target in targets:
        target.close()
