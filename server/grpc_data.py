"""The gRPC server's data port (`loadax.server.zmq_data`): gRPC has no I/O thread of the server's
own, so one thread of its own accepts the data sockets, reads their hellos and watches them for
their end; the calls' handler threads send the replies (`send`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import zmq

from loadax.server.zmq_data import DataPort
from loadax.wire import zmq_data
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)


class GrpcDataPort:
    """The data port of the gRPC server bound to `host` ("" for every address), on `port` (0: any
    free port). `open()` it, `stop()` it."""

    def __init__(self, host: str, port: int) -> None:
        self._port = DataPort(host, port)
        # Written to by `stop`, so that the thread's poll returns.
        self._wake_in, self._wake_out = socket.socketpair()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="loadax-grpc-data", daemon=True)

    @property
    def port(self) -> int:
        """The port bound, once open."""
        return self._port.port

    def open(self) -> int:
        """Bind, listen and start the thread: the port bound (an OSError if it cannot bind)."""
        port = self._port.open()
        self._thread.start()
        return port

    def offer(self, request: wire.HandshakeRequest, response: wire.HandshakeResponse) -> None:
        """Offer a data socket in `response` to the handshake `request` if it asks for one, bound
        to its key."""
        if request.data_socket and len(request.data_key) == zmq_data.KEY_BYTES:
            response.data_port = self._port.port
            response.data_nonce = self._port.offer(request.data_key, request.pipeline)

    def send(self, request: wire.BatchRequest, batch: EncodedBatch) -> bool:
        """Send `batch`, the reply to `request`, on the data socket it names, if it asks for that
        and the socket is open: False if not (nothing was sent: answer it on its call). A reply
        cut short closes the data socket (its client fails what waited on it)."""
        if not request.data_socket or batch.shared_size is not None:
            return False
        return self._port.send(request.data_key, request.data_id, batch)

    def stop(self) -> None:
        """Close the listener and every data socket (a reply being sent is cut short)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_out.send(b"\0")
        if self._thread.is_alive():
            self._thread.join()
        self._wake_in.close()
        self._wake_out.close()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_in, zmq.POLLIN)
        self._port.attach(poller)
        try:
            while not self._stopping.is_set():
                ready = dict(poller.poll(self._port.timeout_ms(time.monotonic())))
                self._port.serve(ready, time.monotonic())
        except Exception:
            log.exception("the gRPC data port's thread failed; its data sockets close")
        finally:
            self._port.close()
