"""The worker's Prometheus metrics: what the transports count, and the HTTP exporter serving them.

Each `WorkerMetrics` has a registry of its own, so that several workers can share a process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from loadax.errors import WorkerError
from loadax.reuse_metrics import ReuseCollector
from loadax.server.memory import MemoryBudget
from loadax.server.share_cache import ShareCache
from loadax.wire.messages import RequestMessage, method_of
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

METHODS = frozenset(wire.DESCRIPTOR.services_by_name["Worker"].methods_by_name)
"""The method labels; any other name a client sends is counted as "unknown", so that clients
cannot grow the label sets without bound."""
R = TypeVar("R")


class WorkerMetrics:
    """Counts the requests of every transport; `start_exporter` serves them over HTTP.

    With `budget`, the gauges `loadax_worker_memory_budget_bytes` and
    `loadax_worker_memory_reserved_bytes` report it; without one they are absent. With
    `share_cache`, `loadax_worker_share_*` report its hits, misses, coalesced requests, bytes
    saved and size.
    """

    def __init__(
        self, budget: MemoryBudget | None = None, share_cache: ShareCache | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        if share_cache is not None:
            self.registry.register(ReuseCollector("loadax_worker_share", share_cache.stats))
        self._requests = Counter(
            "loadax_worker_requests",
            "Requests answered, by method, transport and status code (OK or the error's code).",
            ["method", "transport", "code"],
            registry=self.registry,
        )
        self._seconds = Histogram(
            "loadax_worker_request_seconds",
            "Time to answer the requests that reached a handler (refusals on arrival excluded).",
            ["method", "transport"],
            registry=self.registry,
        )
        self._batches = Counter(
            "loadax_worker_batches",
            "Batches served, by pipeline.",
            ["pipeline"],
            registry=self.registry,
        )
        self._bytes = Counter(
            "loadax_worker_bytes_sent",
            "Encoded batch bytes served, by pipeline.",
            ["pipeline"],
            registry=self.registry,
        )
        self._errors = Counter(
            "loadax_worker_errors",
            "Requests answered with an error, by status code.",
            ["code"],
            registry=self.registry,
        )
        self._in_flight = Gauge(
            "loadax_worker_in_flight",
            "Requests being answered now, by transport.",
            ["transport"],
            registry=self.registry,
        )
        if budget is not None:
            Gauge(
                "loadax_worker_memory_budget_bytes",
                "The memory budget of the batches being built ([server] memory_budget_mb).",
                registry=self.registry,
            ).set(budget.limit)
            Gauge(
                "loadax_worker_memory_reserved_bytes",
                "Bytes of the memory budget reserved by the batches being built now.",
                registry=self.registry,
            ).set_function(lambda: budget.reserved)
        ProcessCollector(registry=self.registry)
        self._exporter: tuple[WSGIServer, threading.Thread] | None = None

    def observe(self, transport: str, request: RequestMessage, call: Callable[[], R]) -> R:
        """`call()`, the answer to `request`, counted: in flight while it runs, then its time
        and status code (a WorkerError's code, INTERNAL for another exception) and, for a
        batch, its pipeline and payload size. Exceptions propagate."""
        method = method_of(request)
        in_flight = self._in_flight.labels(transport)
        in_flight.inc()
        started = time.perf_counter()
        code = "INTERNAL"
        try:
            response = call()
            code = "OK"
        except WorkerError as error:
            code = error.code
            raise
        finally:
            in_flight.dec()
            self._seconds.labels(method, transport).observe(time.perf_counter() - started)
            self._count(transport, method, code)
        if isinstance(request, wire.BatchRequest) and isinstance(response, EncodedBatch):
            self._batches.labels(request.pipeline).inc()
            self._bytes.labels(request.pipeline).inc(response.size)
        return response

    def refused(self, transport: str, method: str, code: str) -> None:
        """Count a request refused before it reached the worker (a missing token, a full
        in-flight limit, a malformed request: its `method` may be any text)."""
        self._count(transport, method if method in METHODS else "unknown", code)

    def _count(self, transport: str, method: str, code: str) -> None:
        self._requests.labels(method, transport, code).inc()
        if code != "OK":
            self._errors.labels(code).inc()

    def start_exporter(self, address: str) -> str:
        """Serve the metrics at http://`address`/metrics ("host:port"; port 0: any free port)
        on a thread of their own; the bound "host:port"."""
        if self._exporter is not None:
            raise RuntimeError("the metrics exporter is started already")
        host, _, port = address.rpartition(":")
        try:
            server, thread = start_http_server(int(port), host.strip("[]"), registry=self.registry)
        except OSError as error:
            raise OSError(f"the metrics exporter cannot listen on {address}: {error}") from error
        self._exporter = server, thread
        return f"{host}:{server.server_address[1]}"

    def stop_exporter(self) -> None:
        """Stop serving the metrics (nothing to do when they are not served)."""
        if self._exporter is None:
            return
        server, thread = self._exporter
        self._exporter = None
        server.shutdown()
        server.server_close()
        thread.join()
