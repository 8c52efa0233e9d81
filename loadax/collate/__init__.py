"""Collation: how a list of records becomes a batch."""
