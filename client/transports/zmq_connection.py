"""The connection of a ZeroMQ client to a worker: its DEALER socket's options (CURVE,
heartbeats, IMMEDIATE, the largest reply), and its state: whether it is up (the socket can send,
IMMEDIATE), and, until it first is, whether the worker refused the security handshake, for good
(ZeroMQ does not retry such a connection), as the socket's monitor events say."""

from __future__ import annotations

import zmq
from zmq.utils.monitor import parse_monitor_message

from loadax.client.security import ClientSecurity
from loadax.errors import WorkerError
from loadax.wire.limits import ZMQ_HEARTBEAT_MS, ZMQ_HEARTBEAT_TIMEOUT_MS

EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
"""The events to monitor."""
_SILENT_REFUSALS = 3  # handshakes failed without a reason that make a refusal (without CURVE)


def connect_dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    address: str,
    security: ClientSecurity,
    max_reply_bytes: int | None,
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A DEALER socket connected to the worker at `address` ("zmq://host:port" or
    "tcp://host:port"), and the socket of its monitor's `EVENTS`, attached before it connects
    (close it once connected: a monitor costs two file descriptors); a ValueError for an address
    ZeroMQ cannot connect to."""
    endpoint = _endpoint(address)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    if security.curve_server_key is not None:
        public, secret = security.curve_client_keypair or tuple(
            key.decode("ascii") for key in zmq.curve_keypair()
        )
        dealer.setsockopt(zmq.CURVE_SERVERKEY, security.curve_server_key.encode())
        dealer.setsockopt(zmq.CURVE_PUBLICKEY, public.encode())
        dealer.setsockopt(zmq.CURVE_SECRETKEY, secret.encode())
    # Replies and requests are bounded by the requests in flight; refusing them would only lose
    # them. Unbounded, a send is refused only without a connection: the socket can send
    # (POLLOUT) exactly while it has one.
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.setsockopt(zmq.SNDHWM, 0)
    if max_reply_bytes is not None:
        dealer.setsockopt(zmq.MAXMSGSIZE, max_reply_bytes)
    # A worker that dies without closing its connection is found by missing heartbeats;
    # the worker's ZeroMQ I/O thread answers them however busy its handlers are.
    dealer.setsockopt(zmq.HEARTBEAT_IVL, ZMQ_HEARTBEAT_MS)
    dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMQ_HEARTBEAT_TIMEOUT_MS)
    # Without a connection a send fails instead of queueing for a peer that may never come
    # back: a batch request goes to another worker at once. (The price: replies received
    # and not yet read when a connection closes are dropped; a stopping worker waits a
    # moment before it closes, for them to be read.)
    dealer.setsockopt(zmq.IMMEDIATE, 1)
    # A refused security handshake fails the requests for good.
    monitor = dealer.get_monitor_socket(EVENTS)
    try:
        dealer.connect(endpoint)
    except zmq.ZMQError as error:
        dealer.disable_monitor()
        monitor.close(linger=0)
        dealer.close(linger=0)
        raise ValueError(f"invalid ZeroMQ address {address!r}: {error}") from None
    return dealer, monitor


class Connection:
    """The connection to the worker `name` as the I/O thread sees it; `curve`: whether the
    client uses CURVE."""

    def __init__(self, name: str, curve: bool) -> None:
        self._name = name
        self._curve = curve
        # Whether a connection is up (its handshake done: the DEALER can send), and whether
        # one ever was.
        self.up = False
        self.connected_once = False
        # Connections whose handshake failed without a reason (e.g. a wrong CURVE server key).
        self.handshake_failures = 0

    def update(self, up: bool) -> bool:
        """Whether the connection being `up` or not is news (then taken)."""
        if up == self.up:
            return False
        self.up = up
        self.connected_once = self.connected_once or up
        return True

    def refusal(self, monitor: zmq.Socket[bytes]) -> WorkerError | None:
        """Take the events waiting on `monitor`: the refusal they make (None if none)."""
        refused: WorkerError | None = None
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return refused
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                refused = WorkerError(
                    "UNAUTHENTICATED",
                    f"{self._name} refused this client's CURVE key (ZAP status {value}): it is "
                    "not on the worker's allowed_clients",
                )
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                refused = WorkerError("UNAUTHENTICATED", self._protocol_failure(value))
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.handshake_failures += 1
                # Without CURVE a handshake fails only against a worker that requires it; when
                # the worker closes first, libzmq says so without the reason. A few in a row,
                # none ever succeeding, are that refusal (a worker dying mid-handshake is not).
                if (
                    not self._curve
                    and not self.connected_once
                    and self.handshake_failures >= _SILENT_REFUSALS
                ):
                    refused = WorkerError(
                        "UNAUTHENTICATED",
                        f"{self._name} closed {self.handshake_failures} security handshakes "
                        "without saying why: it most likely requires CURVE: set "
                        "ClientSecurity.curve_server_key to the worker's public key",
                    )

    def hint(self) -> str:
        """Why a call may have gone unanswered, from the handshakes that failed ('' if none)."""
        if not self.handshake_failures:
            return ""
        return f"; {self.handshake_failures} connections failed their security handshake: " + (
            "is curve_server_key the worker's public key?"
            if self._curve
            else "does the worker require CURVE (ClientSecurity.curve_server_key)?"
        )

    def _protocol_failure(self, code: int) -> str:
        if code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            if self._curve:
                return (
                    f"{self._name} does not use CURVE, but this client does (curve_server_key "
                    "is set): the security handshake failed"
                )
            return (
                f"{self._name} requires CURVE: set ClientSecurity.curve_server_key to the "
                "worker's public key"
            )
        return f"the security handshake with {self._name} failed: ZeroMQ protocol error {code:#x}"


def _endpoint(address: str) -> str:
    for scheme in ("zmq://", "tcp://"):
        if address.startswith(scheme):
            return "tcp://" + address.removeprefix(scheme)
    raise ValueError(f"a ZeroMQ address is zmq://host:port or tcp://host:port, got {address!r}")
