"""The credentials a worker and its clients share: the token and the CURVE keys.

Checked where they are configured (the worker's config, `ClientSecurity`), so that a bad one is
named there rather than failing every request later.
"""

from __future__ import annotations

import re
import struct

from zmq.utils import z85

MAX_TOKEN_CHARS = 4096
BEARER = b"Bearer "
"""What comes before the token on the wire: in gRPC's `authorization` header, in ZeroMQ's 4th
request frame."""
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it travels in a gRPC header too
_Z85 = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def bearer(token: str) -> bytes:
    """The credential that carries `token`, as both transports send it."""
    return BEARER + token.encode("ascii")


def check_token(token: str) -> None:
    """Raises ValueError unless `token` can be a shared token: visible ASCII, no spaces."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ValueError("a token must be non-empty visible ASCII, without spaces")
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"a token has at most {MAX_TOKEN_CHARS} characters, got {len(token)}")


def curve_key(key: object) -> bytes:
    """`key`, a Z85-encoded CURVE key, as ZeroMQ's socket options take it; else ValueError.

    The message never repeats the key: it may be a secret one.
    """
    if not isinstance(key, str):
        raise ValueError(f"must be a Z85 CURVE key (a string), got {type(key).__name__}")
    if not _Z85.fullmatch(key):
        raise ValueError(
            f"must be a Z85 CURVE key: 40 characters of the Z85 alphabet, got {len(key)} "
            "characters" + ("" if len(key) != 40 else " with some outside it")
        )
    try:
        z85.decode(key)
    except (ValueError, KeyError, OverflowError, struct.error) as error:
        raise ValueError(f"must be a Z85 CURVE key: it does not decode: {error}") from None
    return key.encode("ascii")
