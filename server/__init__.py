"""The loadax worker: serves batches of configured pipelines over gRPC and ZeroMQ."""

# This folder ships as loadax.server. Imported by its folder name (`import server` from the
# repository root) it would be a second copy of every module, with classes of its own.
if __name__ != "loadax.server":
    raise ImportError(
        f"{__path__[0]} is the package loadax.server, not {__name__!r}: import loadax.server "
        "(e.g. `from loadax.server.worker import Worker`)"
    )
