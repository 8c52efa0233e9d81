"""Limits both ends of the wire rely on, defined once so that the worker and its clients agree.

A transport's request limit concerns the worker alone and stays with its server.
"""

from __future__ import annotations

MAX_BATCH_BYTES = 1 << 30
"""The largest batch reply (or the rows of a batch one request asks for): 1 GiB. A gRPC worker
refuses to send more, and a gRPC client to receive more."""
DEFAULT_TIMEOUT_S = 30.0
"""How long a client waits for a worker to answer a handshake or an info request by default."""
# The same on both ends: a peer that vanished without closing its connection is given up within
# the timeout, so that the worker frees what it held and the client retries elsewhere.
ZMQ_HEARTBEAT_MS, ZMQ_HEARTBEAT_TIMEOUT_MS = 1_000, 10_000
