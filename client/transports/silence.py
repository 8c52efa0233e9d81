"""Silence: streamed gRPC calls whose worker has stopped sending are failed, by one thread of the
process that watches every reader waiting for a message (`loadax.wire.limits.GRPC_SILENCE_MS`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import grpc

from loadax.errors import WorkerError


class Silence:
    """Cancels a call whose reader has waited `limit_s` seconds for its next message; the
    reader's wait then ends in a `WorkerError` UNAVAILABLE. Its thread runs while readers wait,
    and leaves once none has for `limit_s`."""

    def __init__(self, limit_s: float) -> None:
        self._limit_s = limit_s
        self._changed = threading.Condition()
        # The calls whose reader waits, and since when: the oldest first (in insertion order).
        self._waiting: dict[grpc.Future, float] = {}
        self._silenced: set[grpc.Future] = set()
        self._watching = False

    @contextlib.contextmanager
    def waiting(self, call: grpc.Future, name: str) -> Iterator[None]:
        """The block waits for `call`'s next message, from the worker `name`."""
        with self._changed:
            self._waiting[call] = time.monotonic()
            if not self._watching:
                self._watching = True
                threading.Thread(
                    target=self._watch, name="loadax-grpc-silence", daemon=True
                ).start()
        try:
            yield
        except grpc.RpcError:
            with self._changed:
                silenced = call in self._silenced
            if silenced:
                raise WorkerError(
                    "UNAVAILABLE",
                    f"{name} sent nothing for {self._limit_s:g} s, not even a heartbeat: it is "
                    "frozen or cut off, or a worker too old to send heartbeats",
                ) from None
            raise
        finally:
            with self._changed:
                del self._waiting[call]
                self._silenced.discard(call)

    def _watch(self) -> None:
        """Cancel the calls waited for `limit_s`; leave once none has waited for as long."""
        idle_since = time.monotonic()
        while True:
            with self._changed:
                now = time.monotonic()
                watched = [
                    (call, since)
                    for call, since in self._waiting.items()
                    if call not in self._silenced
                ]
                silent = [call for call, since in watched if now - since >= self._limit_s]
                self._silenced.update(silent)
                if self._waiting:
                    idle_since = now
                elif now - idle_since >= self._limit_s:
                    self._watching = False
                    return
                if not silent:
                    oldest = min((since for _, since in watched), default=now)
                    self._changed.wait(oldest + self._limit_s - now)
            for call in silent:
                call.cancel()  # outside the lock: it runs the call's callbacks
