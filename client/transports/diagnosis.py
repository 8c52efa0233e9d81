"""Why a target does not answer, told in well under a second from a plain socket: its name does
not resolve, nothing listens, nothing answers, or its port speaks another protocol than its
scheme asks for (ZeroMQ for grpc://, gRPC for zmq://, TLS where the client has none, or none
where it has). `loadax ping` and a loader's start-up share it.

It needs neither gRPC nor ZeroMQ: a loadax worker speaks first on a new connection (a ZeroMQ
peer sends its greeting's signature, an HTTP/2 server its SETTINGS frame), and a TLS server,
which waits for the client, answers a ClientHello. A few bytes tell which one listens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import ssl
import time
from typing import Literal

from loadax.client.security import ClientSecurity
from loadax.client.transports import TargetSpec, check_spec

Kind = Literal["unresolved", "refused", "unreachable", "silent", "wrong_protocol"]
"""What went wrong: the name, the connection, the peer's silence, or what the peer speaks."""
Protocol = Literal["grpc", "zmq", "tls", "http", "unknown"]
"""What a port speaks, from its first bytes; "grpc" is HTTP/2 without TLS."""

GREETING_S = 0.2
"""How long a worker has to speak first once connected (at least; 4 connection round trips
when longer), before it is sent a ClientHello to find a TLS server, which waits for one."""
_ENOUGH = 16  # bytes read at most: more than any of the protocols below needs to be told
_ZMTP_SIGNATURE = (0xFF, 0x7F)  # a ZeroMQ greeting's first byte and tenth (8 padding between)
_HTTP2_SETTINGS = 0x04  # the type of the frame an HTTP/2 server sends first
_TLS_RECORDS = (0x15, 0x16)  # a TLS alert or handshake record, then major version 3
# An HTTP/1 status line, or the page an HTTP server sends without one (as to HTTP/0.9).
_HTTP_REPLIES = (b"HTTP/", b"<!DOCTYPE HTML", b"<HTML")
_NAMES = {"grpc": "gRPC", "zmq": "ZeroMQ"}


@dataclasses.dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a target does not answer: `cause`, one line that follows its address; `final`:
    whether waiting is pointless (a name that does not exist, a refused connection, another
    protocol), unlike a target that may yet come up or answer (a timeout, silence)."""

    kind: Kind
    cause: str
    final: bool

    def __str__(self) -> str:
        return self.cause


def diagnose(
    spec: TargetSpec, timeout: float, security: ClientSecurity | None = None
) -> Diagnosis | None:
    """Why the target `spec` would not answer a client with `security`, or None when its port
    speaks what the client will (or `spec` is a worker object, called directly): then the
    cause, if any, is above the connection (a worker starting or busy, a refused token or
    CURVE key, which the transports tell).

    It takes milliseconds for a name that does not resolve, a refused connection or a loadax
    worker (which speaks first); `GREETING_S` more for a TLS port; the whole `timeout` for a
    port that accepts connections and says nothing (give it 0.5 s or more: less may take a TLS
    port for a silent one). Name resolution is bounded by the system's resolver only.

    A ValueError for an address that is not "grpc://host:port" or "zmq://host:port".
    """
    if not isinstance(spec, str):
        return None
    check_spec(spec)
    scheme, host, port = _parts(spec)
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as error:
        final = error.errno != socket.EAI_AGAIN  # a resolver that may answer later
        said = "does not resolve" if final else "cannot be looked up now"
        return Diagnosis("unresolved", f"the name {host!r} {said} ({error.strerror})", final)
    except ConnectionRefusedError:
        return Diagnosis("refused", "connection refused", final=True)
    except TimeoutError:
        return Diagnosis("unreachable", f"no answer to a connection within {timeout:g} s", False)
    except OSError as error:  # no route to the host, a network down...
        return Diagnosis("unreachable", f"cannot connect: {error.strerror or error}", False)
    with connection:
        greeting_wait = max(GREETING_S, 4 * (time.monotonic() - started))
        first, closed = _read(connection, min(deadline, time.monotonic() + greeting_wait))
        if not first and not closed:
            try:
                connection.sendall(_client_hello(host))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            else:
                first, closed = _read(connection, deadline)
    if not first:
        cause = (
            "closes connections without a word"
            if closed
            else f"accepts connections but says nothing within {timeout:g} s"
        )
        return Diagnosis("silent", cause, final=False)
    return _mismatch(scheme, spec.partition("://")[2], _protocol(first), first, security)


def _parts(spec: str) -> tuple[str, str, int]:
    """`spec`'s scheme, host (an IPv6 address without its brackets) and port."""
    scheme, _, rest = spec.partition("://")
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"target {spec!r} must be {scheme}://host:port, with a port 1-65535")
    return scheme, host.removeprefix("[").removesuffix("]"), int(port)


def _read(connection: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """What the peer sent by `deadline`, up to what tells its protocol, and whether it closed
    the connection."""
    received = b""
    while _protocol(received) == "unknown" and len(received) < _ENOUGH:
        left = deadline - time.monotonic()
        if left <= 0:
            return received, False
        connection.settimeout(left)
        try:
            chunk = connection.recv(_ENOUGH - len(received))
        except TimeoutError:
            return received, False
        except ConnectionResetError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
    return received, False


def _client_hello(host: str) -> bytes:
    """The first bytes a TLS client sends to `host`, asking for HTTP/2 as gRPC does."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # without the system's CAs: no check
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    outgoing = ssl.MemoryBIO()
    client = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=host)
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the ServerHello, written
        client.do_handshake()
    return outgoing.read()


def _protocol(first: bytes) -> Protocol:
    """What a peer speaks, from the first bytes it sent."""
    if len(first) >= 10 and (first[0], first[9]) == _ZMTP_SIGNATURE:
        return "zmq"
    if len(first) >= 9 and first[3] == _HTTP2_SETTINGS and first[4:9] == bytes(5):
        return "grpc"  # a SETTINGS frame without flags, on stream 0
    if len(first) >= 2 and first[0] in _TLS_RECORDS and first[1] == 3:
        return "tls"
    if first.upper().startswith(_HTTP_REPLIES):
        return "http"
    return "unknown"


def _mismatch(
    scheme: str, where: str, speaks: Protocol, first: bytes, security: ClientSecurity | None
) -> Diagnosis | None:
    """What is wrong when the port at `where` speaks `speaks` to a client of `scheme` (None:
    nothing)."""
    tls = security is not None and security.tls
    expected = "tls" if scheme == "grpc" and tls else scheme
    if speaks == expected:
        return None
    wanted = _NAMES[scheme]
    if speaks in _NAMES:
        if speaks == scheme:  # gRPC without TLS, to a client with TLS
            cause = "this port speaks gRPC without TLS, but this client has ca_cert set (TLS)"
        else:
            cause = f"this port speaks {_NAMES[speaks]}, not {wanted}: use {speaks}://{where}"
    elif speaks == "tls":
        cause = (
            "this port speaks TLS: set ca_cert (the CA of the worker's certificate)"
            if scheme == "grpc"
            else f"this port speaks TLS (gRPC with TLS?), not ZeroMQ: use grpc://{where} "
            "with ca_cert"
        )
    elif speaks == "http":
        cause = f"this port speaks HTTP, not {wanted} (a metrics port?)"
    else:
        cause = f"this port speaks neither gRPC nor ZeroMQ (it sent {first[:8].hex(' ')})"
    return Diagnosis("wrong_protocol", cause, final=True)
