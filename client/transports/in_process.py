"""The in-process transport: a worker object called directly, without sockets; its batches
still travel as the codec's frames, as over a network."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from loadax.client.transports.reply import Reply
from loadax.wire.limits import DEFAULT_TIMEOUT_S
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire


class WorkerLike(Protocol):
    """What the in-process transport needs of a worker object (e.g.
    `loadax.server.worker.Worker`)."""

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse: ...

    def load_batch(self, request: wire.BatchRequest) -> EncodedBatch: ...


class InProcessTransport:
    """A worker object called on `threads` threads of its own, named `name` (by default after
    its class); a request's future fails with the worker's `WorkerError` as it raised it."""

    def __init__(self, worker: WorkerLike, threads: int = 4, name: str | None = None) -> None:
        self.name = name or f"in-process {type(worker).__name__}"
        self._worker = worker
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="loadax-in-process")

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        del timeout  # a direct call has nothing to wait for
        return self._worker.handshake(request)

    def send(self, request: wire.BatchRequest) -> Future[Reply]:
        return self._pool.submit(self._load, request)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _load(self, request: wire.BatchRequest) -> Reply:
        answer = self._worker.load_batch(request)
        try:
            return Reply(answer.header, answer.frames)
        finally:
            # The reply is handed over: the worker stops counting it against its memory budget
            # (all `release` does; the frames are Python objects, alive while referred to).
            answer.release()
