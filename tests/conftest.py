"""Test-wide setup: eight CPU devices, so that meshes can be built in one process."""

import os

# Must happen before jax is imported by any test module.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
