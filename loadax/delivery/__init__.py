"""Delivery: which rows a process owns, global jax.Arrays from them, device prefetch, meshes."""
