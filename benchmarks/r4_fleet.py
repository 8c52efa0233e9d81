"""R4's fleet: real `loadax-worker` processes on loopback, started and stopped while a loader
uses them, each one's up-time counted (its start-up included: a starting worker costs too)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from local_worker import worker

from loadax.client import RemoteLoader

READY_S = 120.0
"""The most a worker may take to start."""


class Worker:
    """One worker process, run on a thread of its own until `stop`; it joins `loader` once up."""

    def __init__(self, config: Path, started: float) -> None:
        self.started = started
        self.stopped: float | None = None
        self.address: str | None = None
        self.up = threading.Event()
        self.stopping = threading.Event()
        self._config = config
        self.error: BaseException | None = None

    def run(self, loader: RemoteLoader | None) -> None:
        try:
            with worker(self._config, "grpc") as served:
                self.address = served.address
                if loader is not None:
                    loader.add_target(served.address)
                self.up.set()
                self.stopping.wait()
                if loader is not None:
                    loader.remove_target(served.address)
        except BaseException as error:
            self.error = error
            self.up.set()
        finally:
            self.stopped = time.monotonic()

    def stop(self) -> None:
        self.stopping.set()


class Fleet:
    """The workers of `config`, resized at will; `loader` set once it is built on the first."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.loader: RemoteLoader | None = None
        self.workers: list[Worker] = []
        self._threads: list[threading.Thread] = []

    @property
    def size(self) -> int:
        """Workers started and not stopped (starting ones too)."""
        return sum(1 for each in self.workers if not each.stopping.is_set())

    def start(self) -> Worker:
        started = Worker(self.config, time.monotonic())
        thread = threading.Thread(target=started.run, args=(self.loader,), daemon=True)
        self.workers.append(started)
        self._threads.append(thread)
        thread.start()
        return started

    def resize(self, count: int) -> None:
        """Start workers or stop the newest until `count` run."""
        while self.size < count:
            self.start()
        while self.size > count:
            newest = next(each for each in reversed(self.workers) if not each.stopping.is_set())
            newest.stop()

    def worker_seconds(self, since: float, until: float) -> float:
        """Seconds of worker processes up between `since` and `until`, starting ones included."""
        total = 0.0
        for each in self.workers:
            end = each.stopped if each.stopped is not None else until
            total += max(0.0, min(end, until) - max(each.started, since))
        return total

    def close(self) -> None:
        for each in self.workers:
            each.stop()
        for thread in self._threads:
            thread.join(timeout=READY_S)
