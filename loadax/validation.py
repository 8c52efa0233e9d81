"""Argument checks shared by options, plans, datasets, the worker and the client.

Every error names the argument. Bools are never numbers here: `True` is not a batch size.
"""

from __future__ import annotations

from numbers import Real
from typing import Any


def is_int(value: Any, *, minimum: int | None = None) -> bool:
    """True for an int (a Python or numpy int, not a bool) of at least `minimum`.

    >>> from loadax.validation import is_int
    >>> is_int(3, minimum=1), is_int(True), is_int(2.0), is_int(0, minimum=1)
    (True, False, False, False)
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return False
    return minimum is None or value.__index__() >= minimum


def is_number(value: Any) -> bool:
    """True for a real number (an int or a float, numpy's too), not a bool."""
    return not isinstance(value, bool) and isinstance(value, Real)


def require_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """`value` as an int, or a ValueError naming `name`."""
    if not is_int(value):
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


def require_positive(name: str, value: Any, *, unit: str = "") -> float:
    """`value` if it is a number > 0, else a ValueError naming `name` (and the `unit` expected).

    >>> from loadax.validation import require_positive
    >>> require_positive("request_timeout", 0, unit="seconds")
    Traceback (most recent call last):
    ...
    ValueError: request_timeout must be a number of seconds > 0, got 0
    """
    if not (is_number(value) and value > 0):
        kind = f"a number of {unit}" if unit else "a number"
        raise ValueError(f"{name} must be {kind} > 0, got {value!r}")
    return float(value)
