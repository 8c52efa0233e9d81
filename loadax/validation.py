"""Argument checks shared by options, plans and datasets; every error names the argument."""

from __future__ import annotations

from typing import Any


def require_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """`value` as an int, or a ValueError naming `name` (bools are not ints here)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    number = int(value.__index__())
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def require_bool(name: str, value: Any) -> bool:
    """`value` if it is a bool, else a ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value
