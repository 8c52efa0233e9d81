"""The batch codec: pytrees of numpy arrays and Python scalars <-> one msgpack-framed buffer.

Layout: `LDX1`, the header's length (uint32, little-endian), a msgpack header, then, from the
next multiple of 64, every array's raw bytes, each starting at a multiple of 64. The header
holds the tree: dicts, lists and scalars as msgpack, tuples and arrays as extension types (an
array is its dtype, shape and the offset of its bytes). Decoding returns arrays that are views
of the received buffer, not copies, and checks every declared size against the buffer before
using it. No pickle anywhere.

`encode_frames` gives the same bytes as separate frames, with each array's frame a view of the
array itself (no copy), for transports that send several buffers as one message (ZeroMQ);
`decode_frames` reads them back, each array a view of the frame that holds it. `layout` says
where each array of a tree will lie in its encoding before the arrays exist (their `Blank`s), so
that they can be made there.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import re
import struct
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

MAGIC = b"LDX1"
_PREFIX = struct.Struct("<4sI")
ARRAY_ALIGN = 64
"""Where each array starts in a payload: at a multiple of this many bytes from its start, as jax's
CPU backend needs to use a host array in place rather than copy it."""
_ARRAY, _TUPLE = 1, 2
MAX_DEPTH = 32
MAX_DIMENSIONS = 32

_EXTRA_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(getattr(ml_dtypes, name))
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "uint4")
    if hasattr(ml_dtypes, name)
}
_NUMPY_KINDS = frozenset("biufcSU")  # bool, ints, floats, complex, fixed-width bytes and text
# What dtype.str looks like for those kinds: checked before numpy parses untrusted text.
_DTYPE_STR = re.compile(r"[<>|][biufcSU][0-9]{1,5}")


class CodecError(ValueError):
    """A value that cannot be encoded, or a buffer that is not a valid encoding.

    >>> from loadax.wire.codec import decode
    >>> decode(b"not a batch")
    Traceback (most recent call last):
    ...
    loadax.wire.codec.CodecError: buffer starts with b'not ', not the loadax magic b'LDX1'
    """


def encode(tree: Any) -> bytes:
    """One buffer holding `tree`: dicts, lists, tuples, arrays, numbers, str, bytes and None.

    >>> import numpy as np
    >>> from loadax.wire.codec import encode
    >>> buffer = encode({"x": np.arange(3, dtype=np.int32), "label": (1, "cat")})
    >>> type(buffer).__name__, buffer[:4]
    ('bytes', b'LDX1')
    """
    encoded: bytes = b"".join(encode_frames(tree))
    return encoded


def encode_frames(tree: Any) -> list[bytes | memoryview]:
    """The encoding of `tree` as frames that join into `encode(tree)`: the header, then each
    array's bytes (a view of the array, not a copy) and the padding between them.

    >>> import numpy as np
    >>> from loadax.wire.codec import decode_frames, encode, encode_frames
    >>> frames = encode_frames({"x": np.arange(3, dtype=np.int32)})
    >>> len(frames), b"".join(frames) == encode({"x": np.arange(3, dtype=np.int32)})
    (2, True)
    >>> decode_frames(frames)["x"].tolist()
    [0, 1, 2]
    """
    head, arrays = _head(tree)
    frames: list[bytes | memoryview] = [head]
    end = len(head)
    for array in arrays:
        if isinstance(array, Blank):
            raise CodecError("a Blank has no bytes: `layout` takes it, `encode_frames` does not")
        padding = -end % ARRAY_ALIGN
        if padding:
            frames.append(bytes(padding))
        frames.append(array.reshape(-1).view(np.uint8).data)
        end += padding + array.nbytes
    return frames


@dataclasses.dataclass(frozen=True, slots=True)
class Blank:
    """An array that does not exist yet, for `layout`: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def layout(tree: Any) -> tuple[list[int], int]:
    """Where each array of `tree` will start in its encoding, and the encoding's size, for a
    tree whose arrays are `Blank`s (or arrays): the encoding of the same tree with arrays of
    those shapes and dtypes is laid out so.

    >>> import numpy as np
    >>> from loadax.wire.codec import Blank, encode, layout
    >>> blanks = {"x": Blank((3,), np.dtype(np.int32)), "y": Blank((), np.dtype(bool))}
    >>> starts, size = layout(blanks)
    >>> encoded = encode({"x": np.arange(3, dtype=np.int32), "y": np.bool_(True)})
    >>> starts, size == len(encoded), encoded[starts[1]]
    ([64, 128], True, 1)
    """
    head, arrays = _head(tree)
    starts = []
    end = len(head)
    for array in arrays:
        end += -end % ARRAY_ALIGN
        starts.append(end)
        end += array.nbytes
    return starts, end


def _head(tree: Any) -> tuple[bytes, list[np.ndarray[Any, Any] | Blank]]:
    """The encoding's first frame (prefix, header, zeros up to the arrays' start) and the
    arrays, in the order their bytes follow."""
    arrays: list[np.ndarray[Any, Any] | Blank] = []
    try:
        header = msgpack.packb(tree, default=_Packer(arrays), strict_types=True, use_bin_type=True)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError) as error:  # UnicodeEncodeError is a ValueError
        raise CodecError(f"cannot encode: {error}") from error
    head = _PREFIX.pack(MAGIC, len(header)) + header
    return head + bytes(_data_start(len(header)) - len(head)), arrays


def _data_start(header_length: int) -> int:
    end = _PREFIX.size + header_length
    return end + -end % ARRAY_ALIGN


def decode(buffer: bytes | bytearray | memoryview, *, max_depth: int = MAX_DEPTH) -> Any:
    """The tree in `buffer`; its arrays are views of `buffer` (read-only if it is `bytes`).

    >>> import numpy as np
    >>> from loadax.wire.codec import decode, encode
    >>> tree = decode(encode({"x": np.arange(3, dtype=np.int32), "label": (1, "cat")}))
    >>> tree["x"].tolist(), tree["x"].dtype, tree["x"].flags.writeable, tree["label"]
    ([0, 1, 2], dtype('int32'), False, (1, 'cat'))
    """
    return decode_frames([buffer], max_depth=max_depth)


def decode_frames(
    frames: Sequence[bytes | bytearray | memoryview], *, max_depth: int = MAX_DEPTH
) -> Any:
    """The tree whose encoding is `frames` joined; each array is a view of the frame holding it.

    An array that would span two frames is a CodecError: `encode_frames` never splits one.

    >>> import numpy as np
    >>> from loadax.wire.codec import decode_frames, encode
    >>> decode_frames([encode({"y": np.ones(2)})])["y"].tolist()
    [1.0, 1.0]
    """
    if not frames:
        raise CodecError("an encoding has at least one frame")
    views = [memoryview(frame).cast("B") for frame in frames]
    view = views[0]
    if len(view) < _PREFIX.size:
        raise CodecError(f"buffer of {len(view)} bytes is too short to hold a header")
    magic, header_length = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CodecError(f"buffer starts with {bytes(magic)!r}, not the loadax magic {MAGIC!r}")
    header_end = _PREFIX.size + header_length
    if header_end > len(view):
        raise CodecError(
            f"header declares {header_length} bytes but the buffer holds {len(view) - _PREFIX.size}"
        )
    unpacker = _Unpacker(views, _data_start(header_length), max_depth)
    tree = unpacker.unpack(view[_PREFIX.size : header_end], depth=0)
    _refuse_timestamps(tree)
    return tree


def _refuse_timestamps(value: Any) -> None:
    # msgpack decodes its timestamp extension itself, without asking ext_hook.
    if isinstance(value, msgpack.Timestamp):
        raise CodecError("msgpack timestamps are not part of the loadax format")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_timestamps(key)
            _refuse_timestamps(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_timestamps(item)


class _Packer:
    """msgpack's `default`: tuples and arrays become extension types; arrays are laid out after."""

    def __init__(self, arrays: list[np.ndarray[Any, Any] | Blank]) -> None:
        self._arrays, self._offset = arrays, 0

    def __call__(self, value: Any) -> msgpack.ExtType:
        if isinstance(value, tuple):
            items = msgpack.packb(list(value), default=self, strict_types=True, use_bin_type=True)
            return msgpack.ExtType(_TUPLE, items)
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if isinstance(value, np.ndarray | Blank):
            return msgpack.ExtType(_ARRAY, self._place(value))
        raise CodecError(f"cannot encode a {type(value).__name__}: {value!r:.80}")

    def _place(self, array: np.ndarray[Any, Any] | Blank) -> bytes:
        name = dtype_name(array.dtype)
        if isinstance(array, np.ndarray):
            # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
            array = np.require(array, requirements="C")
        self._offset += -self._offset % ARRAY_ALIGN
        descriptor: bytes = msgpack.packb([name, list(array.shape), self._offset, array.nbytes])
        self._arrays.append(array)
        self._offset += array.nbytes
        return descriptor


def dtype_name(dtype: np.dtype[Any]) -> str:
    """How the encoding names `dtype`: its `dtype.str` ("<f4"), or the name of an ml_dtypes type.

    >>> import numpy as np
    >>> from loadax.wire.codec import dtype_name
    >>> dtype_name(np.dtype(np.float32)), dtype_name(np.dtype("U3"))
    ('<f4', '<U3')
    """
    for name, extra in _EXTRA_DTYPES.items():
        if dtype == extra:
            return name
    if dtype.kind not in _NUMPY_KINDS or dtype.itemsize == 0:
        raise CodecError(f"cannot encode arrays of dtype {dtype}")
    return dtype.str


def _dtype_of(name: Any) -> np.dtype[Any]:
    if not isinstance(name, str):
        raise CodecError(f"array dtype must be a string, got {name!r:.80}")
    if name in _EXTRA_DTYPES:
        return _EXTRA_DTYPES[name]
    if not _DTYPE_STR.fullmatch(name):
        raise CodecError(f"array dtype {name!r:.80} is not allowed")
    dtype: np.dtype[Any] = np.dtype(name)
    if dtype.str != name or dtype.itemsize == 0:
        raise CodecError(f"array dtype {name!r:.80} is not allowed")
    return dtype


class _Unpacker:
    """Reads a header, checking every array descriptor against the data part of the buffer."""

    def __init__(self, views: list[memoryview], data_start: int, max_depth: int) -> None:
        self._views, self._data_start, self._max_depth = views, data_start, max_depth
        # Where each frame starts in the joined encoding.
        self._starts = list(itertools.accumulate((len(view) for view in views[:-1]), initial=0))

    def unpack(self, header: memoryview, depth: int) -> Any:
        if depth > self._max_depth:
            raise CodecError(f"tuples nest deeper than {self._max_depth} levels")
        try:
            return msgpack.unpackb(
                header,
                ext_hook=lambda code, data: self._extension(code, data, depth + 1),
                raw=False,
                strict_map_key=False,
                use_list=True,
            )
        except CodecError:
            raise
        except (ValueError, TypeError, msgpack.UnpackException) as error:
            raise CodecError(f"malformed header: {error}") from error

    def _extension(self, code: int, data: bytes, depth: int) -> Any:
        if code == _TUPLE:
            items = self.unpack(memoryview(data), depth)
            if not isinstance(items, list):
                raise CodecError("a tuple extension must hold a list")
            return tuple(items)
        if code == _ARRAY:
            return self._array(data)
        raise CodecError(f"unknown extension type {code}")

    def _array(self, data: bytes) -> np.ndarray[Any, Any]:
        descriptor = msgpack.unpackb(data, raw=False)
        if not (isinstance(descriptor, list) and len(descriptor) == 4):
            raise CodecError(f"malformed array descriptor {descriptor!r:.80}")
        name, shape, offset, nbytes = descriptor
        dtype = _dtype_of(name)
        if not (
            isinstance(shape, list)
            and len(shape) <= MAX_DIMENSIONS
            and all(isinstance(size, int) and size >= 0 for size in shape)
        ):
            raise CodecError(f"malformed array shape {shape!r:.80}")
        if not (isinstance(offset, int) and isinstance(nbytes, int) and offset >= 0):
            raise CodecError(f"malformed array extent {offset!r:.40}, {nbytes!r:.40}")
        count = math.prod(shape)
        if count * dtype.itemsize != nbytes:
            raise CodecError(f"array of shape {shape} and dtype {name} cannot be {nbytes} bytes")
        start = self._data_start + offset
        frame = bisect.bisect_right(self._starts, start) - 1
        local = start - self._starts[frame]
        view = self._views[frame]
        if local + nbytes > len(view):
            where = "the buffer" if len(self._views) == 1 else f"frame {frame}"
            raise CodecError(
                f"array of {nbytes} bytes at offset {offset} runs past the end of {where}"
            )
        array = np.frombuffer(view, dtype=dtype, count=count, offset=local)
        return array.reshape(shape)
