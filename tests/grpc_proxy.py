"""A default-configured gRPC forwarding proxy, as a mesh or an L7 proxy puts between a trainer and
a worker: every call it takes is forwarded to `--upstream` on a channel of its own, with grpcio's
default options on both sides (so a client pinging more often than every 5 minutes without data
gets GOAWAY `too_many_pings`).

    python tests/grpc_proxy.py --upstream 127.0.0.1:50051

It listens on a free loopback port and prints `{"event": "ready", "port": N}`; then a line for
each call that did not end OK (`{"event": "call", "method": ..., "code": ...}`). With
`GRPC_TRACE=http_keepalive` (what `start` sets), gRPC core logs the pings it counts as strikes
and the GOAWAY it sends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

STREAMING = ("/StreamBatch", "/Watch")
"""Methods whose reply is a stream; every other call is forwarded as a unary one."""
_HOP_BY_HOP = {"user-agent", "grpc-accept-encoding", "grpc-encoding", "te", "content-type"}


class Forwarder(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Forwards each call, its metadata, replies and status, as raw bytes to `upstream`."""

    def __init__(self, upstream: grpc.Channel) -> None:
        self._upstream = upstream

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method: str = details.method
        metadata = [(k, v) for k, v in details.invocation_metadata if k not in _HOP_BY_HOP]
        if method.endswith(STREAMING):
            call = self._upstream.unary_stream(method)

            def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
                replies = call(request, metadata=metadata)
                context.add_callback(replies.cancel)
                with _forwarding(method, context, replies):
                    yield from replies

            return grpc.unary_stream_rpc_method_handler(stream)
        unary = self._upstream.unary_unary(method)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            reply = unary.future(request, metadata=metadata)
            context.add_callback(reply.cancel)
            with _forwarding(method, context, reply):
                result: bytes = reply.result()
                return result

        return grpc.unary_unary_rpc_method_handler(forward)


@contextlib.contextmanager
def _forwarding(method: str, context: grpc.ServicerContext, call: Any) -> Iterator[None]:
    """Pass the upstream call's failure on as the call's status, and log it."""
    try:
        yield
    except grpc.FutureCancelledError:  # the client went away (a unary call's reply.cancel())
        _log(method, "CANCELLED")
        raise
    except grpc.RpcError as error:
        code, details = error.code(), error.details()
        _log(method, code.name)
        context.set_trailing_metadata(error.trailing_metadata() or ())
        context.abort(code, details or "")
    else:
        context.set_trailing_metadata(call.trailing_metadata() or ())


def _log(method: str, code: str) -> None:
    print(json.dumps({"event": "call", "method": method, "code": code}), flush=True)


def serve(upstream: str) -> None:
    channel = grpc.insecure_channel(upstream)
    server = grpc.server(futures.ThreadPoolExecutor(64))
    server.add_generic_rpc_handlers((Forwarder(channel),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"event": "ready", "port": port}), flush=True)
    server.wait_for_termination()


@contextlib.contextmanager
def start(upstream: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """A proxy process forwarding to `upstream` ("host:port"): its "host:port", and a function
    that returns everything it has printed so far (its calls, gRPC core's keepalive log)."""
    env = {**os.environ, "GRPC_TRACE": "http_keepalive", "GRPC_VERBOSITY": "info"}
    command = [sys.executable, __file__, "--upstream", upstream]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as process:
        lines: list[str] = []
        assert process.stdout is not None
        for line in process.stdout:  # gRPC core may log before it
            lines.append(line)
            if line.startswith('{"event": "ready"'):
                break
        else:
            raise RuntimeError(f"the proxy exited before it was ready:\n{''.join(lines)}")
        reader = threading.Thread(target=lines.extend, args=(process.stdout,), daemon=True)
        reader.start()
        try:
            port = json.loads(lines[-1])["port"]
            yield f"127.0.0.1:{port}", lambda: "".join(lines)
        finally:
            process.kill()
            process.wait()
            reader.join(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the worker's host:port")
    serve(parser.parse_args().upstream)
