"""The gRPC transport: `GrpcTransport`, a channel to one worker at "grpc://host:port".

A batch comes streamed (`STREAM_BATCH`, its large arrays received into pooled buffers) or in one
reply (`LOAD_BATCH_PAYLOAD`), or on the worker's data socket (`grpc_data`), as the size of the
pipeline's last batch says; either way it is handed over as its header and payload frames,
unverified.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import grpc.experimental

from loadax.buffers import BufferPool
from loadax.client.security import ClientSecurity
from loadax.client.transports.grpc_data import GrpcDataSocket
from loadax.client.transports.grpc_replies import (
    shared_reply,
    streamed_reply,
    unary_reply,
    unless_on_data_socket,
    worker_error,
)
from loadax.client.transports.memory_files import MemoryFiles, SameHostFiles
from loadax.client.transports.reply import Reply, bad_reply
from loadax.client.transports.shared import Shared
from loadax.client.transports.silence import Silence
from loadax.client.transports.zmq_data import REHANDSHAKE_S
from loadax.client.transports.zmq_pending import fail
from loadax.errors import WorkerError
from loadax.wire.credentials import bearer
from loadax.wire.limits import (
    DEFAULT_TIMEOUT_S,
    GRPC_CONNECT_TIMEOUT_MS,
    GRPC_HEARTBEAT_MS,
    GRPC_RECONNECT_BACKOFF_MS,
    GRPC_SILENCE_MS,
    MAX_BATCH_BYTES,
)
from loadax.wire.payloads import (
    DATA_SOCKET_FROM_BYTES,
    HEARTBEAT,
    HEARTBEAT_METADATA,
    LOAD_BATCH_PAYLOAD,
    STREAM_BATCH,
    STREAM_FROM_BYTES,
    STREAM_WINDOW_BYTES,
    MalformedReply,
)
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

_SILENCE = Silence(GRPC_SILENCE_MS / 1000)
STREAM_FROM_S = 0.25
"""A batch that took this long or longer is streamed, with heartbeats, whatever its size: its
worker is found frozen within `GRPC_SILENCE_MS`. A faster one the placement policy gives up at
8x the fleet's p95 latency, within 2 s too."""
_READERS = 16
"""Threads reading the calls of every `GrpcTransport` of the process, at most, so that a
client's threads do not grow with its fleet. A call is read by a thread blocked on it from its
request to its end; more calls than this wait in order for one, their messages held by gRPC
(within each call's flow-control window) meanwhile."""
_SHARED_READERS: Shared[ThreadPoolExecutor] = Shared(
    lambda: ThreadPoolExecutor(_READERS, thread_name_prefix="loadax-grpc-reader"),
    lambda readers: readers.shutdown(wait=False),
)


class _Cancelled:
    """What `GrpcTransport._outcome` answers for a reply cancelled, or a channel closed."""


_CANCELLED = _Cancelled()


class GrpcTransport:
    """A worker reached over gRPC at "grpc://host:port"; over TLS when `security.ca_cert` is
    set, with `security.token` in every call's metadata.

    A worker that dies fails its calls at once (its connection closes); one that freezes fails
    its streamed calls within about two seconds (`GRPC_SILENCE_MS` without a heartbeat); one
    that comes back is connected to again within about one (a bounded back-off). No keepalive
    pings: through a proxy they reach only the proxy, and a default-configured gRPC server or
    proxy answers them (more often than every 5 minutes without data) with GOAWAY.

    A batch of `stream_from_bytes` or more, or one that took `STREAM_FROM_S` or more, is
    streamed and its large arrays received into buffers of `buffers` (by default a pool of its
    own); a smaller, faster one comes in one reply. The first batch of a pipeline is streamed,
    and each next one as the last one's size and time say. A worker on this host writes batches
    into memory files of `files` instead (`send`), unless `shared_memory` is False; one that
    offers a data socket at the handshake sends them there (`grpc_data`) from
    `data_socket_from_bytes` on (and the first of a pipeline), unless `data_socket` is False or
    the channel is TLS (whose protection the data socket would not have).
    """

    LIVENESS: tuple[tuple[str, int], ...] = (
        ("grpc.initial_reconnect_backoff_ms", GRPC_RECONNECT_BACKOFF_MS[0]),
        ("grpc.max_reconnect_backoff_ms", GRPC_RECONNECT_BACKOFF_MS[1]),
        ("grpc.min_reconnect_backoff_ms", GRPC_CONNECT_TIMEOUT_MS),
    )
    """The channel options that find a restarted worker quickly."""

    def __init__(
        self,
        address: str,
        security: ClientSecurity | None = None,
        *,
        buffers: BufferPool | None = None,
        stream_from_bytes: int = STREAM_FROM_BYTES,
        shared_memory: bool = True,
        files: MemoryFiles | None = None,
        data_socket: bool = True,
        data_socket_from_bytes: int = DATA_SOCKET_FROM_BYTES,
    ) -> None:
        self.name = address
        self._stream_from_bytes = stream_from_bytes
        self._data_socket_from_bytes = data_socket_from_bytes
        security = security or ClientSecurity()
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_BATCH_BYTES),
            # A stream's reader thread takes its messages from gRPC itself, not from the
            # channel's thread: a thread switch less per message (measured: 7% less CPU per GB).
            (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
            # Each call receives at most this far ahead of its reader: the client's memory stays
            # within its bound (see STREAM_WINDOW_BYTES).
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
            *self.LIVENESS,
        ]
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
        self._stream_metadata = (
            *(self._metadata or ()),
            (HEARTBEAT_METADATA, str(GRPC_HEARTBEAT_MS)),
        )
        # Whether the worker sends heartbeats: a stream's silence fails it unless it is known
        # not to (its first reply came without one: a worker from before them).
        self._heartbeats: bool | None = None
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        # Called as a stream of one reply, to be read like a stream: a unary call's future
        # would be completed by a thread per channel (gRPC's), one per worker.
        self._load_payload = self._channel.unary_stream(
            LOAD_BATCH_PAYLOAD, request_serializer=wire.BatchRequest.SerializeToString
        )
        self._stream_batch = self._channel.unary_stream(
            STREAM_BATCH, request_serializer=wire.BatchRequest.SerializeToString
        )
        # By pipeline: its last batch's size and seconds, which choose how its next one comes.
        self._last: dict[str, tuple[int, float]] = {}
        self._buffers = buffers or BufferPool()
        # The files a worker on this host writes batches into, once its handshake says it can.
        self._same_host = SameHostFiles(shared_memory, files)
        self._readers = _SHARED_READERS.acquire()
        self._closed = False
        self._data = (
            GrpcDataSocket(address, self._buffers, MAX_BATCH_BYTES, self._rehandshake)
            if data_socket and security.ca_cert is None
            else None
        )

    @property
    def channel(self) -> grpc.Channel:
        """The channel to the worker, for its other services (e.g. health checks)."""
        return self._channel

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.HandshakeResponse:
        """The worker's answer; one that can write into this process's memory files has its
        batches written there from then on (unless `shared_memory` was False). One that offers
        a data socket sends batch replies on it once open (the handshake waits a few of its round
        trips for it: `DataChannel.learn`), unless the worker writes into memory files: then none
        is opened."""
        request = self._same_host.handshake(request)
        if self._data is not None:
            request = self._data.asking(request)
        started = time.monotonic()
        response: wire.HandshakeResponse = self._call(self._stub.Handshake, request, timeout)
        self._same_host.learn(response)
        if self._data is not None and not self._same_host.taken:
            self._data.learn(request, response, time.monotonic() - started)
        return response

    def data_socket_open(self, timeout: float) -> bool:
        """Whether batch replies may come on a data socket: one is open, once the one that the
        handshake offered is open or given up (waiting up to `timeout` seconds)."""
        return self._data is not None and self._data.opened(timeout)

    def _rehandshake(self, request: wire.HandshakeRequest) -> wire.HandshakeResponse:
        """The answer to the handshake `request` (as sent before) that asks for a new data
        socket."""
        try:
            response: wire.HandshakeResponse = self._call(
                self._stub.Handshake, request, REHANDSHAKE_S
            )
        except ValueError:  # grpcio's refusal of a call on a closed channel
            raise WorkerError("UNAVAILABLE", f"{self.name} is closed") from None
        return response

    def info(
        self, request: wire.InfoRequest, timeout: float = DEFAULT_TIMEOUT_S
    ) -> wire.InfoResponse:
        response: wire.InfoResponse = self._call(self._stub.Info, request, timeout)
        return response

    def send(self, request: wire.BatchRequest) -> Future[Reply]:
        """A future of the reply: streamed (`STREAM_BATCH`) unless the last batch of the same
        pipeline was smaller than `stream_from_bytes` and faster than `STREAM_FROM_S`, then in
        one reply. Its payload frames are the messages it came in, or a buffer of `buffers` for
        a segment larger than a streamed message, not reused while they (or anything made from
        them without a copy) are alive. Cancelling it cancels the call.

        To a worker on this host (see `handshake`), the request names a memory file of this
        process that the worker writes the payload into (the reply holds the header alone), and
        the payload is a view of it. To one with a data socket open, the request asks for its
        reply there unless the last batch of the same pipeline was smaller than
        `data_socket_from_bytes`, and the payload is one buffer of `buffers`."""
        # Fail fast on a lost connection: the request is sent elsewhere.
        lease = self._same_host.lease(request)
        last = self._last.get(request.pipeline)
        sent = time.monotonic()
        large = last is None or last[0] >= self._data_socket_from_bytes
        if lease is None and self._data is not None and large:
            expected = self._data.expect(request)
            if expected is not None:
                return self._send_on_data_socket(request, *expected, sent)
        reply: Future[Reply] = Future()
        if lease is not None:
            reply.add_done_callback(lease.settle)
            stream = self._stream_batch(
                lease.request, wait_for_ready=False, metadata=self._stream_metadata
            )
            read: Callable[[], Reply] = functools.partial(
                shared_reply, self._messages(stream), self._buffers.take, lease, self.name
            )
        elif last is None or last[0] >= self._stream_from_bytes or last[1] >= STREAM_FROM_S:
            stream = self._stream_batch(
                request, wait_for_ready=False, metadata=self._stream_metadata
            )
            read = functools.partial(streamed_reply, self._messages(stream), self._buffers.take)
        else:
            stream = self._load_payload(request, wait_for_ready=False, metadata=self._metadata)
            read = functools.partial(unary_reply, stream)
        reply.add_done_callback(lambda future: future.cancelled() and stream.cancel())
        self._readers.submit(self._settle, request, reply, stream, read, sent)
        return reply

    def close(self) -> None:
        self._channel.close()  # ends every call, and so every reader
        if not self._closed:
            self._closed = True
            _SHARED_READERS.release(self._readers)
            self._same_host.close()
            if self._data is not None:
                self._data.close()

    def _send_on_data_socket(
        self,
        request: wire.BatchRequest,
        request_id: int,
        asked: wire.BatchRequest,
        reply: Future[Reply],
        sent: float,
    ) -> Future[Reply]:
        """Send `asked` (`request`, asking for its reply on the data socket as `request_id`) at
        `sent` (`time.monotonic()`): `reply` is completed there, or by its call if the worker
        answers on it (an error, or the batch when the worker has no data socket for it any
        more). A reply that fails otherwise (its data socket lost) or is cancelled cancels its
        call."""
        stream = self._stream_batch(asked, wait_for_ready=False, metadata=self._stream_metadata)

        def ended(future: Future[Reply]) -> None:
            if future.cancelled() or future.exception() is not None:
                stream.cancel()
                if future.cancelled() and self._data is not None:
                    self._data.forget(request_id)
            else:
                self._learn(request, future.result(), sent)

        reply.add_done_callback(ended)
        self._readers.submit(self._settle_on_data_socket, request, request_id, stream)
        return reply

    def _settle(
        self,
        request: wire.BatchRequest,
        reply: Future[Reply],
        call: grpc.Future,
        read: Callable[[], Reply],
        sent: float,
    ) -> None:
        """Finish `reply` with what `read()` receives of `call`, the answer to `request` sent at
        `sent` (`time.monotonic()`), unless it was cancelled."""
        outcome = self._outcome(request, call, read)
        if isinstance(outcome, _Cancelled):
            reply.cancel()
        elif isinstance(outcome, Reply):
            self._learn(request, outcome, sent)
            if reply.set_running_or_notify_cancel():
                reply.set_result(outcome)
            if self._data is not None:
                self._data.answered_elsewhere()
        elif outcome is not None:
            fail(reply, outcome)

    def _learn(self, request: wire.BatchRequest, reply: Reply, sent: float) -> None:
        """`reply` came for `request`, sent at `sent`: its size and time choose how the next
        batch of its pipeline comes."""
        self._last[request.pipeline] = (reply.header.payload_size, time.monotonic() - sent)

    def _settle_on_data_socket(
        self, request: wire.BatchRequest, request_id: int, call: grpc.Future
    ) -> None:
        """Finish the reply to `request` (`request_id` on the data socket) with what its call
        answers, if anything: a call that ends with no message was answered on the data socket,
        whose reader finishes it."""
        read = functools.partial(unless_on_data_socket, self._messages(call), self._buffers.take)
        outcome = self._outcome(request, call, read)
        if outcome is None or isinstance(outcome, _Cancelled) or self._data is None:
            return  # its reply comes on the data socket, or nobody waits for it any more
        entry = self._data.forget(request_id)
        if entry is None:  # the data socket took it, or failed it
            return
        if isinstance(outcome, Reply):
            if entry.future.set_running_or_notify_cancel():
                entry.future.set_result(outcome)
        else:
            fail(entry.future, outcome)

    def _outcome(
        self, request: wire.BatchRequest, call: grpc.Future, read: Callable[[], Reply | None]
    ) -> Reply | Exception | _Cancelled | None:
        """What `read()` receives of `call`, the answer to `request`: the reply (None: none came,
        as `read` allows), the error that fails it (the call then cancelled: nothing more of it
        is read), or `_CANCELLED` (the reply was cancelled, or the channel closed)."""
        try:
            return read()
        except grpc.FutureCancelledError:
            return _CANCELLED
        except grpc.RpcError as error:
            outcome: Exception = worker_error(error)
        except MalformedReply as error:
            outcome = bad_reply(self.name, request, str(error))
        except WorkerError as error:  # the worker went silent
            outcome = error
        except Exception as error:  # a bug: raised as it is, not taken for a hang
            outcome = error
        call.cancel()  # nothing happens if it is over
        return outcome

    def _messages(self, stream: Any) -> Iterator[bytes]:
        """The messages of `stream` without its heartbeats; a wait for one longer than
        `GRPC_SILENCE_MS` fails with UNAVAILABLE, unless the worker sends no heartbeats."""
        beating = True
        while True:
            if self._heartbeats is False:
                message = next(stream, None)
            else:
                with _SILENCE.waiting(stream, self.name):
                    message = next(stream, None)
            if message is None:
                return
            if beating:
                beating = self._heartbeats = message == HEARTBEAT
                if beating:
                    continue
            yield message

    def _call(self, method: Any, request: Any, timeout: float) -> Any:
        """A unary call that waits for a connection, up to `timeout`; errors as `WorkerError`."""
        try:
            return method(request, timeout=timeout, wait_for_ready=True, metadata=self._metadata)
        except grpc.RpcError as error:
            raise worker_error(error) from None
