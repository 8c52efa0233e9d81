"""An example of a user's own pipelines, served by a loadax worker (see ../../README.md)."""
