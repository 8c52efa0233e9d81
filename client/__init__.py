"""The remote client: `RemoteDataLoader` and the transports it reaches workers with."""

# This folder ships as loadax.client. Imported by its folder name (`import client` from the
# repository root) it would be a second copy of every module, with classes of its own.
if __name__ != "loadax.client":
    raise ImportError(
        f"{__path__[0]} is the package loadax.client, not {__name__!r}: import loadax.client "
        "(e.g. `from loadax.client import RemoteDataLoader`)"
    )

from loadax.client.remote import RemoteDataLoader
from loadax.client.remote_loader import RemoteLoader
from loadax.client.security import ClientSecurity
from loadax.iterators.stats import LoaderStats, WorkerStats

__all__ = ["ClientSecurity", "LoaderStats", "RemoteDataLoader", "RemoteLoader", "WorkerStats"]
