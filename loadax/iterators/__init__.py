"""The iterators every loader shares: ordered, bounded prefetch, checkpointable."""
