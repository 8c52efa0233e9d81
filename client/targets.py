"""Where a RemoteDataLoader sends requests: gRPC and ZeroMQ workers, or worker objects in-process.

Every target answers a handshake and turns a batch request into a future of the decoded batch;
failures are `WorkerError`s with a gRPC status code name, whatever the transport.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import grpc

from loadax.client.replies import decode_batch
from loadax.client.security import ClientSecurity
from loadax.client.zmq_transport import ZmqTarget
from loadax.errors import WorkerError
from loadax.wire.credentials import bearer
from loadax.wire.limits import DEFAULT_TIMEOUT_S, MAX_BATCH_BYTES
from loadax.wire.payloads import LOAD_BATCH_PAYLOAD, EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc


class Target(Protocol):
    """One worker, however it is reached."""

    name: str

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse: ...

    def load_batch(self, request: wire.BatchRequest) -> Future[Any]:
        """A future of the decoded batch; its exception is a `WorkerError`."""
        ...

    def close(self) -> None: ...


class WorkerLike(Protocol):
    """What an in-process target needs of a worker object (e.g. `loadax.server.worker.Worker`)."""

    def handshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse: ...

    def load_batch(self, request: wire.BatchRequest) -> EncodedBatch: ...


class GrpcTarget:
    """A worker reached over gRPC at "grpc://host:port"; over TLS when `security.ca_cert` is
    set, with `security.token` in every call's metadata."""

    def __init__(self, address: str, security: ClientSecurity | None = None) -> None:
        self.name = address
        security = security or ClientSecurity()
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_BATCH_BYTES)]
        target = address.removeprefix("grpc://")
        if security.ca_cert is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            if security.tls_server_name is not None:
                options.append(("grpc.ssl_target_name_override", security.tls_server_name))
            key, cert = security.client_key, security.client_cert
            credentials = grpc.ssl_channel_credentials(
                root_certificates=security.ca_cert.read_bytes(),
                private_key=None if key is None else key.read_bytes(),
                certificate_chain=None if cert is None else cert.read_bytes(),
            )
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._metadata = (
            None
            if security.token is None
            else (("authorization", bearer(security.token).decode("ascii")),)
        )
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        # The payload arrives as the raw reply: decoded as views of it, never copied.
        self._load_payload = self._channel.unary_unary(
            LOAD_BATCH_PAYLOAD, request_serializer=wire.BatchRequest.SerializeToString
        )

    @property
    def channel(self) -> grpc.Channel:
        """The channel to the worker, for its other services (e.g. health checks)."""
        return self._channel

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        response: wire.HandshakeResponse = self._call(self._stub.Handshake, request, timeout)
        return response

    def info(
        self, request: wire.InfoRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.InfoResponse:
        response: wire.InfoResponse = self._call(self._stub.Info, request, timeout)
        return response

    def load_batch(self, request: wire.BatchRequest) -> Future[Any]:
        batch: Future[Any] = Future()
        # Fail fast on a lost connection: the dispatcher sends the request elsewhere.
        call = self._load_payload.future(request, wait_for_ready=False, metadata=self._metadata)

        def done(finished: Any) -> None:
            if batch.cancelled():
                return
            try:
                batch.set_result(decode_batch([finished.result()], request.step, self.name))
            except grpc.FutureCancelledError:
                batch.cancel()
            except grpc.RpcError as error:
                batch.set_exception(_worker_error(error))
            except WorkerError as error:
                batch.set_exception(error)

        call.add_done_callback(done)
        batch.add_done_callback(lambda future: future.cancelled() and call.cancel())
        return batch

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any, timeout: float) -> Any:
        """A unary call that waits for a connection, up to `timeout`; errors as `WorkerError`."""
        try:
            return method(request, timeout=timeout, wait_for_ready=True, metadata=self._metadata)
        except grpc.RpcError as error:
            raise _worker_error(error) from None


class InProcessTarget:
    """A worker object called directly, without sockets; batches still go through the codec."""

    def __init__(self, worker: WorkerLike, threads: int = 4) -> None:
        self.name = f"in-process {type(worker).__name__}"
        self._worker = worker
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="loadax-in-process")

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        del timeout  # a direct call has nothing to wait for
        return self._worker.handshake(request)

    def load_batch(self, request: wire.BatchRequest) -> Future[Any]:
        return self._pool.submit(self._load, request)

    def _load(self, request: wire.BatchRequest) -> Any:
        return decode_batch(self._worker.load_batch(request).frames, request.step, self.name)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _worker_error(error: grpc.RpcError) -> WorkerError:
    code = error.code()
    return WorkerError(code.name if code is not None else "UNKNOWN", error.details() or "")


TargetSpec = str | WorkerLike


def connect(spec: TargetSpec, security: ClientSecurity | None = None) -> Target:
    """A target from "grpc://host:port", "zmq://host:port" or a worker object.

    `security` applies to the addresses; a worker object is called directly, without it.
    """
    if security is not None and not isinstance(security, ClientSecurity):
        raise ValueError(f"security must be a ClientSecurity, got {type(security).__name__}")
    if isinstance(spec, str):
        if spec.startswith("grpc://"):
            return GrpcTarget(spec, security)
        if spec.startswith("zmq://"):
            return ZmqTarget(spec, security)
        raise ValueError(f"target {spec!r} must start with grpc:// or zmq://")
    if callable(getattr(spec, "load_batch", None)) and callable(getattr(spec, "handshake", None)):
        return InProcessTarget(spec)
    raise ValueError(f"target must be an address or a worker object, got {type(spec).__name__}")
