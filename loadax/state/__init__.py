"""State: the iterator checkpoint format, and its Orbax integration."""
