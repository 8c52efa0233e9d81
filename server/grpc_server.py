"""The worker over gRPC: the server of the `loadax.wire.v1.Worker` service
(`loadax.server.grpc_service`), with health checks and reflection.

It keeps sockets and framing: every call goes to its `RequestPath`, and its `Ledger` holds the
call until it has ended. Memory stays bounded: few batches load at once, each client has few calls
in flight, and a call counts until its reply has left (gRPC holds a reply its client does not
read). Optionally TLS (mutual, with a client CA) secures the connection and a shared token must
come with every Worker call; health checks and reflection stay open to probes. Without TLS, a
data port beside the gRPC port carries batch replies to the clients that ask for it at their
handshake (`loadax.server.grpc_data`).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from loadax.server.admission import Transport
from loadax.server.config_security import TlsConfig
from loadax.server.grpc_data import GrpcDataPort
from loadax.server.grpc_service import SERVICE, TokenCheck, worker_handlers
from loadax.server.handler_pool import HandlerPool
from loadax.server.ledger import Ledger
from loadax.server.metrics import WorkerMetrics
from loadax.server.request_path import RequestPath
from loadax.server.worker import Worker
from loadax.validation import require_int
from loadax.wire.limits import GRPC_MIN_PING_INTERVAL_MS, MAX_BATCH_BYTES, MAX_REQUEST_BYTES

__all__ = ["HEALTH_CHECK_S", "SERVICE", "GrpcServer"]

log = logging.getLogger(__name__)

HEALTH_CHECK_S = 0.5
"""How often the health service's status follows whether the worker can load."""
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_TRANSPORT = Transport(
    "grpc",
    send_token="send the metadata 'authorization: Bearer <token>'",
    counted="LoadBatch calls",
    batches_only=True,
    max_reply_bytes=MAX_BATCH_BYTES,
)


class GrpcServer:
    """Serves `worker` on `address` ("host:port"; port 0 picks a free port).

    `threads` batches load at once, shared fairly between the clients waiting; a client (a
    connection, by `context.peer()`, and the id its requests name: see `RequestPath.arrive`)
    may have `max_in_flight_per_client` LoadBatch calls in flight, and the server holds at most
    `max_concurrent_rpcs` calls, each on a handler thread (idle ones leave); beyond either,
    calls get RESOURCE_EXHAUSTED. A LoadBatch call counts, and its batch keeps its share of
    the worker's memory budget, until the call has ended: its reply sent, or the call
    cancelled (the client gone too). A connection may have `max_concurrent_rpcs` calls open at
    once; more are refused (HTTP/2 REFUSED_STREAM, which a gRPC client reports as UNAVAILABLE).
    A batch of more than `max_reply_bytes` (a client takes `MAX_BATCH_BYTES`) is refused with
    INVALID_ARGUMENT, before it is built when its size is known.

    With `tls` the server speaks only TLS; with `token`, Worker calls without the metadata
    `authorization: Bearer <token>` get UNAUTHENTICATED. Every Worker call is counted in
    `metrics` (by default, metrics of its own).

    On `data_port` (0: any free port; None: none), on the address's host, clients that ask for
    it at their handshake open a data socket that their successful batch replies come on
    (`loadax.wire.zmq_data`); never with `tls`, whose protection covers the gRPC connection
    only: its payloads stay inside.
    """

    def __init__(
        self,
        worker: Worker,
        address: str,
        *,
        threads: int,
        max_in_flight_per_client: int,
        max_concurrent_rpcs: int = 128,
        max_reply_bytes: int = MAX_BATCH_BYTES,
        tls: TlsConfig | None = None,
        token: str | None = None,
        metrics: WorkerMetrics | None = None,
        data_port: int | None = 0,
    ) -> None:
        require_int("max_reply_bytes", max_reply_bytes, minimum=1)
        requests = RequestPath(
            worker,
            dataclasses.replace(_TRANSPORT, max_reply_bytes=max_reply_bytes),
            threads=threads,
            max_in_flight_per_client=max_in_flight_per_client,
            token=token,
            metrics=metrics,
        )
        require_int("max_concurrent_rpcs", max_concurrent_rpcs, minimum=1)
        # TLS protects the gRPC connection, not a plain socket: its payloads stay inside.
        self._data: GrpcDataPort | None = None
        if data_port is not None and tls is None:
            require_int("data_port", data_port, minimum=0)
            host = address.rpartition(":")[0].strip("[]")
            self._data = GrpcDataPort(host, data_port)
        self._address = address
        self._tls = tls
        self._requests = requests
        # One handler thread per admitted call, so that a call is counted against its client
        # as soon as it arrives rather than when a busy pool gets round to it, and waits its
        # turn for a loading slot. gRPC counts a call against `maximum_concurrent_rpcs` from
        # its submission to this pool until its handler returns, so the pool needs no more
        # threads than that; they leave once idle.
        self._executor = HandlerPool(max_concurrent_rpcs, "loadax-grpc")
        self._server = grpc.server(
            self._executor,
            interceptors=[] if token is None else [TokenCheck(requests.admission)],
            maximum_concurrent_rpcs=max_concurrent_rpcs,
            options=[
                ("grpc.max_send_message_length", max_reply_bytes),
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                # What one connection can have the worker hold: every call it opens has state
                # in the worker until its status is sent, which waits for a client that does
                # not read. Its calls beyond this many at once are refused (REFUSED_STREAM).
                ("grpc.max_concurrent_streams", max_concurrent_rpcs),
                # Two workers must not silently share a port.
                ("grpc.so_reuseport", 0),
                # Accept older clients' keepalive pings, between calls too (they find a frozen
                # worker with them); only pings faster than theirs are strikes. Clients that
                # take heartbeats send none.
                ("grpc.keepalive_permit_without_calls", 1),
                # (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS)
                ("grpc.http2.min_ping_interval_without_data_ms", GRPC_MIN_PING_INTERVAL_MS),
            ],
        )
        self._server.add_generic_rpc_handlers(worker_handlers(requests, self._data))
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        health_service = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection(
            (SERVICE, health_service, reflection.SERVICE_NAME), self._server
        )
        self._worker = worker
        self._started = False
        self._stopping = threading.Event()
        self._health_watch = threading.Thread(
            target=self._watch_health, name="loadax-grpc-health", daemon=True
        )

    @property
    def ledger(self) -> Ledger:
        """What the server holds for its clients until their calls have ended."""
        return self._requests.ledger

    def start(self) -> str:
        """Listen and serve; returns the bound "host:port" (with the port that was picked)."""
        if self._started:
            raise RuntimeError("the gRPC server is started already")
        host = self._address.rpartition(":")[0]
        try:
            if self._tls is None:
                port = self._server.add_insecure_port(self._address)
            else:
                credentials = grpc.ssl_server_credentials(
                    [(self._tls.private_key, self._tls.cert_chain)],
                    root_certificates=self._tls.client_ca,
                    require_client_auth=self._tls.client_ca is not None,
                )
                port = self._server.add_secure_port(self._address, credentials)
        except RuntimeError as error:
            raise OSError(
                f"gRPC cannot listen on {self._address}: {_why_not(self._address)} ({error})"
            ) from error
        if not port:
            raise OSError(f"gRPC cannot listen on {self._address}: {_why_not(self._address)}")
        if self._data is not None:
            log.info("gRPC batch replies on data port %d", self._data.open())
        self._server.start()
        self._started = True
        for service in ("", SERVICE):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._health_watch.start()
        return f"{host}:{port}"

    @property
    def data_port(self) -> int | None:
        """The data port once started (`loadax.wire.zmq_data`); None: batch replies go over
        gRPC only (turned off, or TLS)."""
        return None if self._data is None else self._data.port

    def _watch_health(self) -> None:
        """Report NOT_SERVING while the worker cannot load (`Worker.serving`), SERVING again
        when it can; the stop's NOT_SERVING is final."""
        serving = True
        while not self._stopping.wait(HEALTH_CHECK_S):
            now = self._worker.serving
            if now != serving:
                serving = now
                status = health_pb2.HealthCheckResponse.SERVING if now else _NOT_SERVING
                for service in ("", SERVICE):
                    self._health.set(service, status)

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, refuse new calls and those waiting to load, let the loading ones
        finish (up to `grace` seconds; later ones are cancelled), then return once no handler
        runs any more."""
        self._stopping.set()
        if self._health_watch.is_alive():
            self._health_watch.join()
        self._health.enter_graceful_shutdown()
        self._requests.stop()
        self._server.stop(grace).wait()
        if self._data is not None:  # ends the sends of handlers still running past the grace
            self._data.stop()
        self._executor.shutdown(wait=True)


def _why_not(address: str) -> str:
    """Why a socket cannot listen on `address` ("host:port"), as the OS says it (e.g. "address
    already in use"); gRPC's own error does not say."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, ValueError) as error:
        return f"the address does not resolve: {error}"
    for family, kind, protocol, _, where in infos:
        with socket.socket(family, kind, protocol) as probe:
            try:
                probe.bind(where)
            except OSError as error:
                return (error.strerror or str(error)).lower()
    return "gRPC refused it"
