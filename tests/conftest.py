"""Test-wide setup: eight CPU devices, so that meshes can be built in one process; and an
S3-compatible server for the modules that read object stores."""

import os

# Must happen before jax is imported by any test module.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator

import pytest
from moto_server import Moto


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """An S3-compatible server (moto, in server mode) on loopback, for a module's tests."""
    server = Moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.close()
