"""The sending side of T1's yardsticks: `KIND --bytes B --batches N [--port P]` streams N
pre-built batches of B bytes over raw TCP (`sendall`), ZeroMQ PUSH (`copy=False`) or gRPC server
streaming (raw bytes, a generic handler: no protobuf).

It prints {"event": "ready", ...} once connected (TCP, ZeroMQ: to the client's port P) or
listening (gRPC: its port), then TCP and ZeroMQ wait for a line on stdin before sending, so that
the client's clock starts first. gRPC sends when called, and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import zmq
from workloads import t1_payload

GRPC_METHOD = "/loadax.bench.Raw/Stream"


def grpc_options(batch_bytes: int) -> list[tuple[str, int]]:
    """Channel and server options that let batches of `batch_bytes` through."""
    return [
        ("grpc.max_send_message_length", 2 * batch_bytes),
        ("grpc.max_receive_message_length", 2 * batch_bytes),
    ]


def ready(**fields: Any) -> None:
    print(json.dumps({"event": "ready", **fields}), flush=True)


def send_tcp(port: int, batches: int, batch_bytes: int) -> None:
    payload = t1_payload(batch_bytes).data
    with socket.create_connection(("127.0.0.1", port)) as connection:
        ready()
        sys.stdin.readline()
        for _ in range(batches):
            connection.sendall(payload)


def send_zmq(port: int, batches: int, batch_bytes: int) -> None:
    payload = t1_payload(batch_bytes)
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    ready()
    sys.stdin.readline()
    for _ in range(batches):
        push.send(payload.data, copy=False)
    push.close(linger=-1)  # wait until everything is sent
    context.term()


def serve_grpc(batch_bytes: int) -> None:
    payload = t1_payload(batch_bytes).tobytes()

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        for _ in range(int(request)):
            yield payload

    handler = grpc.method_handlers_generic_handler(
        GRPC_METHOD.split("/")[1], {"Stream": grpc.unary_stream_rpc_method_handler(stream)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(2), options=grpc_options(batch_bytes))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ready(port=port)
    sys.stdin.read()  # until the client closes it
    server.stop(grace=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["tcp", "zmq", "grpc"])
    parser.add_argument("--bytes", type=int, required=True, help="the size of a batch")
    parser.add_argument("--batches", type=int, default=0, help="how many to send (TCP, ZeroMQ)")
    parser.add_argument("--port", type=int, default=0, help="the client's port (TCP, ZeroMQ)")
    args = parser.parse_args()
    if args.kind == "tcp":
        send_tcp(args.port, args.batches, args.bytes)
    elif args.kind == "zmq":
        send_zmq(args.port, args.batches, args.bytes)
    else:
        serve_grpc(args.bytes)


if __name__ == "__main__":
    main()
