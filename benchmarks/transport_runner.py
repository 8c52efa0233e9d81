"""T1's yardsticks, the receiving side: the workload's batches from `transport_server.py` in
another process over raw loopback TCP (`recv_into` a preallocated buffer), ZeroMQ PULL
(`copy=False`) and gRPC server streaming of raw bytes (each message a fresh `bytes`). loadax over
each transport is `loadax_runner.py`'s.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import zmq
from harness import Setup, System, Trial, main
from transport_server import GRPC_METHOD, grpc_options
from workloads import T1_BATCH_BYTES, Workload

SERVER = Path(__file__).resolve().with_name("transport_server.py")
CONNECT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0


def start_server(
    kind: str, spec: Workload, *args: str
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """The process sending `spec`'s batches, and its ready event."""
    command = [sys.executable, str(SERVER), kind, "--bytes", str(T1_BATCH_BYTES[spec.name])]
    process = subprocess.Popen([*command, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if process.stdout is None or process.stdin is None:
        raise RuntimeError("the server was started without pipes")
    line = process.stdout.readline()
    if not line:
        process.kill()
        raise RuntimeError(f"transport_server.py {kind} exited with {process.wait()} before ready")
    event: dict[str, Any] = json.loads(line)
    return process, event


def go(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is None:
        raise RuntimeError("the server was started without a stdin pipe")
    process.stdin.write(b"go\n")
    process.stdin.flush()


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def tcp(setup: Setup) -> Trial:
    batches = setup.workload.records
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    process, _ = start_server("tcp", setup.workload, "--batches", str(batches), "--port", str(port))
    listener.settimeout(CONNECT_TIMEOUT_S)
    connection, _ = listener.accept()
    listener.close()
    size = T1_BATCH_BYTES[setup.workload.name]
    buffer: npt.NDArray[np.uint8] = np.empty(size, dtype=np.uint8)
    view = buffer.data

    def received() -> Iterator[npt.NDArray[np.uint8]]:
        go(process)
        for _ in range(batches):
            filled = 0
            while filled < size:
                count = connection.recv_into(view[filled:])
                if not count:
                    raise ConnectionError(f"the sender closed after {filled} bytes of a batch")
                filled += count
            yield buffer

    def close() -> None:
        connection.close()
        stop(process)

    return Trial(received, close)


def zeromq(setup: Setup) -> Trial:
    batches = setup.workload.records
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    process, _ = start_server("zmq", setup.workload, "--batches", str(batches), "--port", str(port))

    def received() -> Iterator[npt.NDArray[np.uint8]]:
        go(process)
        for _ in range(batches):
            frame = pull.recv(copy=False)
            yield np.frombuffer(frame.buffer, dtype=np.uint8)

    def close() -> None:
        pull.close(linger=0)
        context.term()
        stop(process)

    return Trial(received, close)


def grpc_raw(setup: Setup) -> Trial:
    batches = setup.workload.records
    process, ready = start_server("grpc", setup.workload)
    options = grpc_options(T1_BATCH_BYTES[setup.workload.name])
    channel = grpc.insecure_channel(f"127.0.0.1:{ready['port']}", options=options)
    grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    stream = channel.unary_stream(GRPC_METHOD)

    def received() -> Iterator[npt.NDArray[np.uint8]]:
        for message in stream(str(batches).encode()):
            yield np.frombuffer(message, dtype=np.uint8)

    def close() -> None:
        channel.close()
        stop(process)

    return Trial(received, close)


SYSTEMS: dict[str, System] = {
    "raw TCP": tcp,
    "ZeroMQ PUSH/PULL": zeromq,
    "gRPC raw bytes": grpc_raw,
}

if __name__ == "__main__":
    main(SYSTEMS)
