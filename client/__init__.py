"""The remote client: `RemoteDataLoader` and the transports it reaches workers with."""

from loadax.client.remote import RemoteDataLoader, RemoteLoader
from loadax.client.security import ClientSecurity

__all__ = ["ClientSecurity", "RemoteDataLoader", "RemoteLoader"]
