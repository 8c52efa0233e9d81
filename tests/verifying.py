"""A transport with the `ReplyDecoder` above it, as a loader holds them: for tests that load
batches through one transport, verified as the training loop would get them."""

from __future__ import annotations

from concurrent import futures
from typing import Any, Generic, TypeVar

from loadax.client.replies import ReplyDecoder
from loadax.client.transports import Reply, Transport
from loadax.wire.v1 import worker_pb2 as wire

T = TypeVar("T", bound=Transport)
WAIT_S = 30.0


class Verifying(Generic[T]):
    """`transport` and its decoder: `handshake` learns each response's schema, `load` gives the
    verified batch of a request (or raises what the loader would)."""

    def __init__(self, transport: T) -> None:
        self.transport = transport
        self.decoder = ReplyDecoder(transport.name)

    @property
    def name(self) -> str:
        return self.transport.name

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = WAIT_S
    ) -> wire.HandshakeResponse:
        return self.decoder.learn(self.transport.handshake(request, timeout))

    def load(self, request: wire.BatchRequest, timeout: float = WAIT_S) -> Any:
        """The verified batch that answers `request`, waiting up to `timeout` for it."""
        return self.verify(request, self.transport.send(request), timeout)

    def verify(
        self, request: wire.BatchRequest, reply: futures.Future[Reply], timeout: float = WAIT_S
    ) -> Any:
        """The verified batch of `reply` to `request`, once it is done (within `timeout`)."""
        done, _ = futures.wait([reply], timeout)
        if not done:
            raise TimeoutError(f"{self.name} did not answer within {timeout} s")
        return self.decoder.verify(request, reply)

    def close(self) -> None:
        self.transport.close()
