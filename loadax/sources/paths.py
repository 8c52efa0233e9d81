"""The paths a file source is given: one path, URL or glob, or a sequence of them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def listed_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], source: str
) -> list[str | os.PathLike[str]]:
    """`paths` (one path, URL or glob, or a sequence of them) as a list, checked: a ValueError
    that names `source` for none, or for anything that is not a str or os.PathLike."""
    if isinstance(paths, str | os.PathLike):
        listed: list[Any] = [paths]
    elif isinstance(paths, Sequence):
        listed = list(paths)
    else:
        raise ValueError(
            f"{source}: paths must be a path, a URL, a glob or a sequence of them, got {paths!r}"
        )
    if not listed:
        raise ValueError(f"{source}: paths must not be empty")
    for path in listed:
        if not isinstance(path, str | os.PathLike):
            raise ValueError(f"{source}: paths must be str or os.PathLike, got {path!r}")
    return listed
