"""What every part of the worker's config is checked with: the error it raises, and how keys,
values and files are checked and shown in its messages."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A worker config that cannot be used; the message names the file and the key."""


def check_keys(source: str, table: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> None:
    """Typos must not pass unnoticed: every key of `table` must be one of `known`."""
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{source}: unknown key {prefix}{key}{hint}; expected one of: {', '.join(known)}"
            )


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


def show(value: Any) -> str:
    """A config value as TOML-ish text: strings in double quotes."""
    return json.dumps(value, default=repr)


def show_name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)
