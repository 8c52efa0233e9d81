"""What every part of the worker's config is checked with: the error it raises, and how keys,
values and files are checked and shown in its messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadax.factories import ConfigError, check_keys, show, show_name

__all__ = ["ConfigError", "check_keys", "config_path", "read_file", "show", "show_name"]


def config_path(source: str, base: Path, key: str, value: Any) -> Path:
    """A file path from the config: relative ones are relative to the config file."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: {key} must be a file path, got {show(value)}")
    return base / Path(value).expanduser()


def read_file(source: str, key: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{source}: {key}: cannot read {path}: {error.strerror}") from None
