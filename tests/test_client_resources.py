"""A client's resources do not grow with its fleet: with 64 real workers (served by one other
process, tests/many_workers.py) a client's loader that reads batches from all of them adds at
most 32 threads to its process and 2 file descriptors per member over gRPC and 3 over ZeroMQ
(the socket of its connection, a ZeroMQ socket's mailbox, and the data socket); measured by
benchmarks/client_resources.py. The ZeroMQ transports and gRPC data sockets of a process share
one I/O thread, which ends with the last of them, and a forked child makes its own."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from workers import worker_process

from loadax.client.transports.zmq import ZmqTransport
from loadax.wire.v1 import worker_pb2 as wire

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30.0
MEMBERS = 64
MAX_THREADS = 32
"""Threads a client's loader adds to its process at most: those there before it (the
interpreter's, and JAX's backend's, by the machine's cores) are not the loader's."""
FDS_PER_MEMBER = {"grpc": 2, "zmq": 3}
SHARED_FDS = 16
"""File descriptors a client's transports share, whatever its fleet: ZeroMQ's context (its
mailbox, and an epoll and a mailbox for each of its 2 I/O threads and its reaper: 7) and the
I/O thread's epoll and wake-up pipe (3): 10; gRPC's pollers and wake-ups: 4 here (8 with the
I/O thread and a context, for its data sockets); and room for a few more (a library's version)."""


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_client_of_64_workers_has_at_most_32_threads_and_2_or_3_fds_per_member(
    transport: str, tmp_path: Path
) -> None:
    report = tmp_path / "resources.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "client_resources.py")]
    command += ["--transports", transport, "--workers", str(MEMBERS), "--json", str(report)]
    subprocess.run(command, check=True, timeout=120)
    (client,) = json.loads(report.read_text())
    assert client["members"] == MEMBERS, client
    assert client["threads"] - client["threads_before"] <= MAX_THREADS, client
    fds = FDS_PER_MEMBER[transport] * MEMBERS + SHARED_FDS
    assert client["fds"] - client["fds_before"] <= fds, client


def test_zeromq_transports_share_one_io_thread_ended_with_the_last_and_a_forked_child_makes_its_own(
    tmp_path: Path,
) -> None:
    with worker_process(tmp_path, grpc=False, zmq=True) as worker:
        address = worker.address("zmq")
        first, second = ZmqTransport(address), ZmqTransport(address)
        assert first.info(wire.InfoRequest(), timeout=WAIT_S).pipelines
        assert len(_io_threads()) == 1
        # The fork in a process of its own: this one may have started JAX, which warns at a fork.
        forked = subprocess.run(
            [sys.executable, "-c", FORKS, address, str(WAIT_S)], timeout=10 * WAIT_S
        )
        assert forked.returncode == 0
        first.close()
        assert second.info(wire.InfoRequest(), timeout=WAIT_S).pipelines
        (thread,) = _io_threads()
        second.close()
        thread.join(WAIT_S)
        assert not thread.is_alive()


FORKS = """
import os, sys
from loadax.client.transports.zmq import ZmqTransport
from loadax.wire.v1 import worker_pb2 as wire
address, wait = sys.argv[1], float(sys.argv[2])
parent = ZmqTransport(address)
assert parent.info(wire.InfoRequest(), timeout=wait).pipelines
child = os.fork()
if child == 0:  # its parent's I/O thread did not follow it: it needs its own
    served = False
    try:  # not closed: the process ends, whatever happens
        served = bool(ZmqTransport(address).info(wire.InfoRequest(), timeout=wait).pipelines)
    finally:
        os._exit(0 if served else 1)
sys.exit(os.waitpid(child, 0)[1] != 0)
"""


def _io_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "loadax-zmq-io"]
