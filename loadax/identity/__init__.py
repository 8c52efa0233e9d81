"""A pipeline's fingerprint: the digest of its code (a walk of every callable it holds) and of a
probe of its output, which local loaders and workers compute alike."""
