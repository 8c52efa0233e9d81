"""Limits both ends of the wire rely on, defined once so that the worker and its clients agree."""

from __future__ import annotations

MAX_BATCH_BYTES = 1 << 30
"""The largest batch reply (or the rows of a batch one request asks for): 1 GiB. A worker refuses
a batch larger than this (INVALID_ARGUMENT, before building it when its bytes per row are known;
a server's `max_reply_bytes` sets a smaller limit), and a client receives no more."""
MAX_REQUEST_ROWS = 1 << 20
"""The rows that one batch request may always name (a host's share of a batch names its rows);
a request for more may exceed `MAX_REQUEST_BYTES`."""
MAX_REQUEST_BYTES = 4 * MAX_REQUEST_ROWS + (64 << 10)
"""The largest request a worker reads, on either transport (over ZeroMQ, the largest frame): the
row positions of `MAX_REQUEST_ROWS` rows, each a varint of at most 4 bytes (positions below
2**28, in a batch of up to 268 million rows), and 64 KiB for the rest (pipeline name, fingerprint,
plan, step). ZeroMQ disconnects a peer whose frame is larger before reading it; gRPC refuses the
call with RESOURCE_EXHAUSTED (tests/test_memory_bounds.py checks that the largest request fits).
"""
MAX_LISTED_ROWS = MAX_REQUEST_ROWS // 4
"""The rows that one batch request may name the records of (`BatchRequest.records`, for a
length-bucketed plan): 8 bytes a record and at most 4 a row keep it within `MAX_REQUEST_BYTES`."""
DEFAULT_TIMEOUT_S = 30.0
"""How long a client waits for a worker to answer a handshake or an info request by default."""

# Failure detection: a worker that dies, freezes or drains is left within about two seconds, and
# one that comes back is used again within about one. The same numbers on both ends, so that a
# worker also frees at once what a vanished client held.

ZMQ_HEARTBEAT_MS = 500
"""How often each end of a ZeroMQ connection pings the other; ZeroMQ's own I/O thread answers,
however busy the Python handlers are, so a ping unanswered means a peer frozen or gone."""
ZMQ_HEARTBEAT_TIMEOUT_MS = 2_000
"""Silence (after a ping) that drops a ZeroMQ connection and fails the requests on it: four
heartbeats. A reply frame still arriving counts as silence: one frame must cross in this time
(250 MB at 1 Gbit/s)."""
GRPC_HEARTBEAT_MS = 500
"""How often a worker sends a heartbeat (an empty message) on a streamed batch call whose client
asks for them, from the call's start until the batch's header. Heartbeats are data: a proxy
forwards them from the worker itself, and they reset any gRPC server's ping limits, where
keepalive pings reach only the nearest proxy, and one configured as gRPC's default server counts
pings more often than every 5 minutes without data as strikes (beyond 2: GOAWAY
`too_many_pings`, every call on the connection failed)."""
GRPC_SILENCE_MS = 2_000
"""How long a client waits for the next message of a streamed call from a worker that heartbeats
before it fails the call with UNAVAILABLE: four heartbeats. A payload message still arriving
counts as silence: one must cross in this time (512 KiB: 2 Mbit/s)."""
GRPC_MIN_PING_INTERVAL_MS = 500
"""The most often a worker accepts pings without data: older clients, without heartbeats, ping
every second, between calls too, to find a frozen worker; pings faster than this are strikes."""
GRPC_CONNECT_TIMEOUT_MS = 1_000
"""How long one connection attempt may take (gRPC's `min_reconnect_backoff_ms`): a worker
frozen mid-handshake is given up in this time, not gRPC's 20 s, so that calls do not wait on it."""
GRPC_RECONNECT_BACKOFF_MS = (100, 1_000)
"""The first and the longest wait between connection attempts (gRPC's defaults: 1 s and 120 s):
a restarted worker is found within a second of listening again; a dead one costs a refused
connection per second."""
