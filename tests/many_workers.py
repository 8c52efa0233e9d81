"""Many workers in one process, for a client that must reach a fleet: `--count` workers of
`tests/pipelines.py`'s `numbers`, each served as `loadax-worker` serves one (`GrpcServer` or
`ZmqServer`, with its own admission and limits) on a free loopback port of its own. They share
one `Worker.from_config` (its pipelines and threads): building 64 takes 15 s, serving one from
many addresses is what a worker serving gRPC and ZeroMQ at once does. Prints one JSON line,
`{"event": "ready", "targets": [...]}` (the addresses as clients name them), and serves until
SIGTERM, SIGINT or the end of its stdin (its parent gone).

    python tests/many_workers.py --transport zmq --count 64
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path

from loadax.server.config import load_config
from loadax.server.grpc_server import GrpcServer
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer

CONFIG = """
[server]
threads = 4

[pipelines.numbers]
factory = "pipelines:numbers"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("grpc", "zmq"), required=True)
    parser.add_argument("--count", type=int, required=True, help="workers to serve")
    args = parser.parse_args()
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    # Requests cancelled as a client leaves are no news here.
    logging.basicConfig(level=logging.ERROR)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "worker.toml"
        path.write_text(CONFIG)
        address = "127.0.0.1:0" if args.transport == "grpc" else "tcp://127.0.0.1:0"
        config = load_config(path, **{args.transport: address})
        worker = Worker.from_config(config)
        servers: list[GrpcServer | ZmqServer] = []
        try:
            for _ in range(args.count):
                limits = {"threads": config.threads, "max_in_flight_per_client": 16}
                if args.transport == "grpc":
                    servers.append(GrpcServer(worker, address, **limits))
                else:
                    servers.append(ZmqServer(worker, address, **limits))
            bound = [server.start().removeprefix("tcp://") for server in servers]
            targets = [f"{args.transport}://{address}" for address in bound]
            print(json.dumps({"event": "ready", "targets": targets}), flush=True)
            stop.wait()
        finally:
            # At once, as loadax-worker stops its servers: each waits a moment for its replies.
            stoppers = [threading.Thread(target=server.stop, args=(0.0,)) for server in servers]
            for stopper in stoppers:
                stopper.start()
            for stopper in stoppers:
                stopper.join()
            worker.close()


if __name__ == "__main__":
    main()
