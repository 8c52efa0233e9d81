"""The digests a pipeline's fingerprint is made of: length-prefixed sha256 of parts, and the
digests of plain values (None, numbers, strings, bytes), the leaves of `code_walk`'s walk."""

from __future__ import annotations

import hashlib
from typing import Any

LARGE_BYTES = 1 << 20
"""A str or bytes longer than this is data: hashed by type and length."""


def hashed(*parts: bytes) -> bytes:
    """The sha256 of `parts`, each length-prefixed so that no two sequences of parts collide."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


def text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def leaf_digest(value: Any) -> bytes | None:
    """The digest of a plain value (None: not a plain value). Large ones are data: by length."""
    kind = type(value)
    if value is None or value is Ellipsis:
        return hashed(b"const", text(repr(value)))
    if kind is bool:
        return hashed(b"bool", b"1" if value else b"0")
    if kind is int:
        return hashed(b"int", value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True))
    if kind is float:
        return hashed(b"float", text(value.hex()))
    if kind is complex:
        return hashed(b"complex", text(value.real.hex()), text(value.imag.hex()))
    if kind is str or kind is bytes:
        if len(value) > LARGE_BYTES:
            return hashed(b"large", text(kind.__name__), text(str(len(value))))
        return hashed(text(kind.__name__), text(value) if kind is str else value)
    return None


def plain(value: str | bytes | bytearray | int | float) -> Any:
    """The builtin value of an instance of a subclass of a builtin scalar type."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return bytes(value)
