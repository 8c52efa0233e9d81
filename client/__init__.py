"""The remote client: `RemoteDataLoader` and the transports it reaches workers with."""

from loadax.client.remote import RemoteDataLoader, RemoteLoader
from loadax.client.security import ClientSecurity
from loadax.client.stats import LoaderStats, WorkerStats

__all__ = ["ClientSecurity", "LoaderStats", "RemoteDataLoader", "RemoteLoader", "WorkerStats"]
