"""The threads that connect the fleet's listed members for the driver (`Connect`): a handshake
waits on the network, which the driver's thread must never do."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from loadax.client.member import Member

CONNECTORS = 2
"""Members connected at once."""


class Connectors:
    """Connects members by name with `connect` (the member, or an error saying why not), on
    `CONNECTORS` threads started at the first: each connected member goes to `joined`, each
    failure to `unreachable` (the name, the error); one connected once `close`d is closed."""

    def __init__(
        self,
        connect: Callable[[str], Member],
        joined: Callable[[Member], None],
        unreachable: Callable[[str, str], None],
    ) -> None:
        self._connect, self._joined, self._unreachable = connect, joined, unreachable
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def connect(self, name: str) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(CONNECTORS, thread_name_prefix="loadax-connect")
        self._pool.submit(self._connected, name)

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _connected(self, name: str) -> None:
        try:
            member = self._connect(name)
        except Exception as error:
            self._unreachable(name, str(error))
            return
        if self._closed:
            member.transport.close()
        else:
            self._joined(member)
