"""The remote client: `RemoteDataLoader` and the transports it reaches workers with."""

from loadax.client.remote import RemoteDataLoader, RemoteLoader

__all__ = ["RemoteDataLoader", "RemoteLoader"]
