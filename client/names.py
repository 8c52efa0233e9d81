"""Targets named by a host name: each stands for every address the name lists (DNS or
/etc/hosts), looked up again over time, e.g. a Kubernetes headless service."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable
from typing import TypeGuard

from loadax.client.transports import TargetSpec
from loadax.logfields import fields

_log = logging.getLogger("loadax.client")

Resolver = Callable[[str], list[str]]
"""A host name -> the IP addresses it lists."""


def resolve_host(host: str) -> list[str]:
    """Every address DNS (or /etc/hosts) lists for `host`, sorted."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def host_is_name(spec: TargetSpec) -> TypeGuard[str]:
    """Whether `spec` is an address whose host is a name (not an IP address).

    >>> host_is_name("grpc://workers.data:50051"), host_is_name("zmq://[::1]:5555")
    (True, False)
    """
    if not isinstance(spec, str) or "://" not in spec:
        return False
    host = spec.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def listed_addresses(spec: str, resolver: Resolver) -> list[str]:
    """The addresses `spec`, whose host is a name, stands for: one per address `resolver` lists.

    >>> listed_addresses("grpc://workers:50051", lambda host: ["10.0.0.5", "fd00::7"])
    ['grpc://10.0.0.5:50051', 'grpc://[fd00::7]:50051']
    """
    scheme, rest = spec.split("://", 1)
    host, port = rest.rsplit(":", 1)
    return [
        f"{scheme}://[{address}]:{port}" if ":" in address else f"{scheme}://{address}:{port}"
        for address in resolver(host)
    ]


class NamedAddresses:
    """What the target names list: every address they listed, the members among them, and those
    left out, asked again at each refresh. Thread-compatible: the membership changes it under
    its lock.

    >>> named = NamedAddresses()
    >>> named.listed.update({"grpc://10.0.0.1:1", "grpc://10.0.0.2:1"})
    >>> named.bound({"grpc://10.0.0.1:1"})
    >>> named.relisted({"grpc://10.0.0.2:1", "grpc://10.0.0.3:1"})
    ({'grpc://10.0.0.1:1'}, set(), ['grpc://10.0.0.2:1', 'grpc://10.0.0.3:1'])
    """

    def __init__(self) -> None:
        self.listed: set[str] = set()
        self._members: set[str] = set()
        self._refused: set[str] = set()

    def bound(self, chosen: set[str]) -> None:
        """The build chose `chosen`: the listed addresses among them are members, the others
        left out."""
        self._members, self._refused = self.listed & chosen, self.listed - chosen

    def relisted(self, listed: set[str]) -> tuple[set[str], set[str], list[str]]:
        """The names list `listed` now: the members gone, the left-out addresses gone (what left
        them out is forgotten), and the addresses to ask, in order (new, or left out)."""
        gone, self._members = self._members - listed, self._members & listed
        forgotten, self._refused = self._refused - listed, self._refused & listed
        return gone, forgotten, sorted(listed - self._members)

    def joined(self, name: str) -> None:
        """`name`, if a name listed it, is a member now."""
        if name in self.listed:
            self._refused.discard(name)
            self._members.add(name)

    def refused(self, name: str) -> None:
        """`name`, if a name listed it, was left out: asked again at the next refresh."""
        if name in self.listed:
            self._refused.add(name)


def every(
    seconds: float, refresh: Callable[[], None], sleep: Callable[[float], bool], names: list[str]
) -> None:
    """`refresh()` the addresses of `names` on a thread of its own every `seconds`, until
    `sleep(seconds)` says it is closed; a refresh that fails is logged (training goes on)."""

    def run() -> None:
        while not sleep(seconds):
            try:
                refresh()
            except Exception as error:  # a failed lookup must not stop training
                _log.warning(
                    "re-resolving %s failed: %s",
                    names,
                    error,
                    extra=fields(event="resolve_failed", error=error),
                )

    threading.Thread(target=run, name="loadax-refresh", daemon=True).start()
