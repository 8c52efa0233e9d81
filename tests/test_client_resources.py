"""A client's resources do not grow with its fleet: with 64 real workers (served by one other
process, tests/many_workers.py) a client process that reads batches from all of them holds at
most 32 threads and 2 file descriptors per member (the socket of its connection, and a ZeroMQ
socket's mailbox), over gRPC and ZeroMQ; measured by benchmarks/client_resources.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = 64
MAX_THREADS = 32
FDS_PER_MEMBER = 2
SHARED_FDS = 16
"""File descriptors a client's transports share, whatever its fleet: ZeroMQ's context (its
mailbox, and an epoll and a mailbox for each of its 2 I/O threads and its reaper: 7) and the
I/O thread's epoll and wake-up pipe (3): 10; gRPC's pollers and wake-ups: 4 here; and room for
a few more (a library's version)."""


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_client_of_64_workers_has_at_most_32_threads_and_2_fds_per_member(
    transport: str, tmp_path: Path
) -> None:
    report = tmp_path / "resources.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "client_resources.py")]
    command += ["--transports", transport, "--workers", str(MEMBERS), "--json", str(report)]
    subprocess.run(command, check=True, timeout=120)
    (client,) = json.loads(report.read_text())
    assert client["members"] == MEMBERS, client
    assert client["threads"] <= MAX_THREADS, client
    assert client["fds"] - client["fds_before"] <= FDS_PER_MEMBER * MEMBERS + SHARED_FDS, client
