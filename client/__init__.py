"""The remote client: RemoteDataLoader and its transports."""
