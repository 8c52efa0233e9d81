"""The addresses in the worker's config: gRPC's and the metrics exporter's "host:port", ZeroMQ's
"tcp://host:port", each checked to be well formed and to name an address of this machine."""

from __future__ import annotations

import re
import socket
from typing import Any

from loadax.server.config_checks import ConfigError, show

_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")


def listen_address(source: str, key: str, value: Any) -> str:
    """A "host:port" (gRPC's, the metrics exporter's) whose host resolves."""
    if not isinstance(value, str) or not _host_port(value):
        raise ConfigError(
            f'{source}: {key} must be "host:port" (port 0: any free port), got {show(value)}'
        )
    _check_resolves(source, key, value)
    return value


def zmq_endpoint(source: str, key: str, value: Any) -> str:
    if (
        isinstance(value, str)
        and value.startswith("tcp://")
        and _host_port(value.removeprefix("tcp://"), wildcard=True)
    ):
        _check_resolves(source, key, value.removeprefix("tcp://"))
        return value
    raise ConfigError(
        f'{source}: {key} must be "tcp://host:port" (port 0: any free port), got {show(value)}'
    )


def _check_resolves(source: str, key: str, address: str) -> None:
    """A ConfigError unless the host of `address` ("host:port") names an address to listen on."""
    host = address.rpartition(":")[0].strip("[]")
    if host in ("*", ""):
        return
    try:
        socket.getaddrinfo(host, None, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        raise ConfigError(
            f"{source}: {key}: the host {host!r} does not resolve ({error}); listen on an "
            'address of this machine, e.g. "0.0.0.0" for all of them'
        ) from None


def _host_port(address: str, *, wildcard: bool = False) -> bool:
    host, separator, port = address.rpartition(":")
    return (
        bool(separator)
        and (bool(_HOST.match(host)) or (wildcard and host == "*"))
        and port.isdigit()
        and port.isascii()
        and int(port) <= 65535
    )
