"""One process of a tf.data service on loopback, for R1's peer: `dispatcher`, or `worker ADDRESS`.

Prints {"event": "ready", "address": ...} once serving, then serves until it is terminated. Runs
in the peers' environment.
"""

from __future__ import annotations

import argparse
import importlib
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["dispatcher", "worker"])
    parser.add_argument("dispatcher", nargs="?", help="the dispatcher's host:port (for a worker)")
    args = parser.parse_args()
    # By name: TensorFlow lives in the peers' environment only, not where mypy checks this file.
    service = importlib.import_module("tensorflow").data.experimental.service
    if args.role == "dispatcher":
        server = service.DispatchServer(service.DispatcherConfig(port=0))
        address = server.target.split("://", 1)[1]
    else:
        if args.dispatcher is None:
            parser.error("a worker needs the dispatcher's address")
        server = service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=args.dispatcher, worker_address="localhost:%port%"
            )
        )
        address = args.dispatcher
    print(json.dumps({"event": "ready", "address": str(address)}), flush=True)
    server.join()


if __name__ == "__main__":
    main()
