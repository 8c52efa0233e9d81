"""A tree as the codec would give it back, without its bytes: what a batch made and used in one
process (a local member's of kind threads) is handed over as, so that where it was made never
changes what its user gets.

`decoded_form(tree)` equals `decode_frames(encode_frames(tree))` in every node's type, every
dict's keys and their order, and every array's dtype, shape, bytes and flags: the arrays are the
tree's own (made C-contiguous, numpy scalars made 0-d arrays, as encoding does), where decoding
gives views of the same memory. A tree holding anything else (a subclass of a dict, a key that is
a tuple, text that is not ASCII, nesting deeper than the codec reads) goes through the codec
itself, so that its form, or the `CodecError` that refuses it, is the codec's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loadax.wire.codec import MAX_DEPTH, decode_frames, encode_frames

_SCALARS = frozenset({float, bool, bytes, type(None)})  # encoded and decoded as they are
_KEYS = frozenset({str, int, *_SCALARS})
_INT_RANGE = range(-(1 << 63), 1 << 64)  # what msgpack encodes of an int
# Each dtype met, as the codec decodes it (checked and named by the codec once per dtype); text
# and bytes have a dtype per width, so the most kept is bounded.
_WIRE_DTYPES: dict[np.dtype[Any], np.dtype[Any]] = {}
_MOST_DTYPES = 256


class _Unusual(Exception):
    """A node this walk does not mirror: the whole tree goes through the codec."""


def decoded_form(tree: Any) -> Any:
    """`tree` as `decode_frames(encode_frames(tree))` gives it, its arrays its own.

    >>> import numpy as np
    >>> from loadax.wire.decoded_form import decoded_form
    >>> image = np.zeros((2, 3), np.float32)
    >>> form = decoded_form({"image": image, "label": np.int64(7), "pair": [1, ("a", None)]})
    >>> form["image"] is image, form["label"].shape, form["label"].dtype, form["pair"]
    (True, (), dtype('int64'), [1, ('a', None)])
    """
    try:
        return _form(tree, 0)
    except _Unusual:
        return decode_frames(encode_frames(tree))


def _form(node: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _Unusual
    kind = type(node)
    if kind is dict:
        if not all(type(key) in _KEYS and _plain(key) for key in node):
            raise _Unusual
        return {key: _form(value, depth + 1) for key, value in node.items()}
    if kind is list:
        return [_form(item, depth + 1) for item in node]
    if isinstance(node, tuple):  # a named tuple too: the codec gives a plain one back
        return tuple(_form(item, depth + 1) for item in node)
    if isinstance(node, np.ndarray | np.generic):
        return _array(np.asarray(node))
    if kind in _KEYS and _plain(node):
        return node
    raise _Unusual


def _plain(value: Any) -> bool:
    """Whether the codec gives the scalar `value` back as it is: an int msgpack holds, text
    that encodes (ASCII, or checked), any other of `_KEYS`."""
    kind = type(value)
    if kind is int:
        return value in _INT_RANGE
    if kind is str and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
    return True


def _array(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """`array` as decoded: a plain C-contiguous ndarray of the codec's dtype."""
    dtype = _WIRE_DTYPES.get(array.dtype)
    if dtype is None:
        dtype = decode_frames(encode_frames(np.empty(0, array.dtype))).dtype
        if len(_WIRE_DTYPES) >= _MOST_DTYPES:
            _WIRE_DTYPES.clear()
        _WIRE_DTYPES[array.dtype] = dtype
    if not array.flags.c_contiguous:
        array = np.require(array, requirements="C")  # as the codec encodes it
    if type(array) is not np.ndarray or array.dtype is not dtype:
        array = array.view(np.ndarray).view(dtype)
    return array
