"""How a client reaches a worker: transports that only move bytes, one per URL scheme.

A transport answers a handshake and sends a batch request, handing over the reply's header and
payload frames unverified (`Reply`); verification and the meaning of failures sit above it, once,
in `loadax.client.replies`. Its connection's liveness (keepalive, heartbeats, reconnection,
refused security handshakes) is its own. A new transport is a module with a class that honours
`Transport`, and its entry in `TRANSPORTS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Protocol

from loadax.buffers import BufferPool
from loadax.client.security import ClientSecurity
from loadax.client.transports.grpc import GrpcTransport
from loadax.client.transports.in_process import InProcessTransport, WorkerLike
from loadax.client.transports.memory_files import MemoryFiles
from loadax.client.transports.reply import Buffer, Reply
from loadax.client.transports.zmq import ZmqTransport
from loadax.wire.limits import DEFAULT_TIMEOUT_S
from loadax.wire.v1 import worker_pb2 as wire

__all__ = [
    "TRANSPORTS",
    "Buffer",
    "Reply",
    "TargetSpec",
    "Transport",
    "WorkerLike",
    "check_spec",
    "connect",
]


class Transport(Protocol):
    """One worker, however it is reached."""

    name: str

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        """The worker's answer, as it is (a `WorkerError` if it refused or was not reached)."""
        ...

    def send(self, request: wire.BatchRequest) -> Future[Reply]:
        """A future of the reply's header and payload frames. Its exception is a `WorkerError`:
        the worker's (a failed record's `RecordFailed`, as it travels), UNAVAILABLE and the like
        for the connection, BAD_REPLY (DATA_LOSS) for framing that does not hold; anything else
        is a bug. Cancelling it cancels the request on the wire."""
        ...

    def close(self) -> None: ...


class Opener(Protocol):
    """How a transport is made from an address."""

    def __call__(
        self,
        address: str,
        security: ClientSecurity | None = None,
        *,
        buffers: BufferPool | None = None,
        shared_memory: bool = True,
        files: MemoryFiles | None = None,
    ) -> Transport: ...


TRANSPORTS: Mapping[str, Opener] = {"grpc": GrpcTransport, "zmq": ZmqTransport}
"""The transport of each URL scheme."""

TargetSpec = str | WorkerLike
"""An entry of a loader's target list: "scheme://host:port" or a worker object."""


def check_spec(spec: object) -> None:
    """A ValueError unless `spec` is an address of a scheme of `TRANSPORTS` or a worker object."""
    if isinstance(spec, str):
        if spec.partition("://")[0] not in TRANSPORTS or "://" not in spec:
            schemes = " or ".join(f"{scheme}://" for scheme in TRANSPORTS)
            raise ValueError(f"target {spec!r} must start with {schemes}")
    elif not (
        callable(getattr(spec, "load_batch", None)) and callable(getattr(spec, "handshake", None))
    ):
        raise ValueError(f"target must be an address or a worker object, got {type(spec).__name__}")


def connect(
    spec: TargetSpec,
    security: ClientSecurity | None = None,
    buffers: BufferPool | None = None,
    *,
    shared_memory: bool = True,
    files: MemoryFiles | None = None,
) -> Transport:
    """The transport to `spec`: of its URL scheme for an address, in-process for a worker object.

    `security` applies to the addresses; a worker object is called directly, without it. An
    address receives its batches into `buffers` (by default a pool of its own): a loader shares
    one among its workers, so that they keep one spare buffer between them, not one each. A
    worker on this host writes them into this process's memory files instead, unless
    `shared_memory` is False (see `loadax.wire.shared_memory`): into `files` (by default a
    pool of its own), which a loader shares the same way.
    """
    if security is not None and not isinstance(security, ClientSecurity):
        raise ValueError(f"security must be a ClientSecurity, got {type(security).__name__}")
    check_spec(spec)
    if isinstance(spec, str):
        opener = TRANSPORTS[spec.partition("://")[0]]
        return opener(spec, security, buffers=buffers, shared_memory=shared_memory, files=files)
    return InProcessTransport(spec)
