"""loadax.wire.codec: round trips, zero-copy decoding, refusal of what it cannot carry or parse."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import enum
import math
import struct
import tracemalloc
from typing import Any

import ml_dtypes
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from loadax.wire.codec import _EXTRA_DTYPES, MAGIC, MAX_DIMENSIONS, CodecError, decode, encode

EXTRA_DTYPES = [
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
]

# --- building buffers by hand, following the layout in codec.py's docstring ---


def _buffer(header: bytes, data: bytes = b"") -> bytes:
    """`LDX1`, the header length, the header, zero padding to a multiple of 64, then `data`."""
    prefix = struct.pack("<4sI", MAGIC, len(header)) + header
    return prefix + bytes(-len(prefix) % 64) + data


def _array_ext(dtype: Any, shape: Any, offset: Any, nbytes: Any) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([dtype, shape, offset, nbytes]))


def _header(tree: Any) -> bytes:
    header: bytes = msgpack.packb(tree, use_bin_type=True)
    return header


# --- comparing trees ---


def _assert_same_array(decoded: Any, original: np.ndarray[Any, Any] | np.generic) -> None:
    expected = np.asarray(original)
    assert isinstance(decoded, np.ndarray)
    assert decoded.dtype == expected.dtype
    assert decoded.shape == expected.shape
    # Bytes, not ==: NaNs compare unequal, and bfloat16/float8 have no fast equality.
    assert decoded.tobytes() == expected.tobytes()


def _assert_same_tree(decoded: Any, original: Any) -> None:
    if isinstance(original, np.ndarray | np.generic):
        _assert_same_array(decoded, original)
    elif isinstance(original, dict):
        assert type(decoded) is dict
        assert list(decoded) == list(original)
        for key, value in original.items():
            _assert_same_tree(decoded[key], value)
    elif isinstance(original, list | tuple):
        assert type(decoded) is type(original)
        assert len(decoded) == len(original)
        for decoded_item, original_item in zip(decoded, original, strict=True):
            _assert_same_tree(decoded_item, original_item)
    elif isinstance(original, float):
        assert type(decoded) is float
        assert decoded == original or (math.isnan(decoded) and math.isnan(original))
    else:
        assert type(decoded) is type(original)
        assert decoded == original


_ALLOWED_DECODED = (dict, list, tuple, np.ndarray, int, float, bool, str, bytes, type(None))


def _assert_only_codec_types(tree: Any) -> None:
    assert isinstance(tree, _ALLOWED_DECODED), type(tree)
    if isinstance(tree, dict):
        for key, value in tree.items():
            _assert_only_codec_types(key)
            _assert_only_codec_types(value)
    elif isinstance(tree, list | tuple):
        for item in tree:
            _assert_only_codec_types(item)


# --- strategies ---

_numpy_dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="="),
    hnp.unsigned_integer_dtypes(endianness="="),
    hnp.floating_dtypes(endianness="=", sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness="=", sizes=(64, 128)),
    hnp.byte_string_dtypes(min_len=1, max_len=6),
    hnp.unicode_string_dtypes(min_len=1, max_len=6),
    # Byte-swapped arrays are carried as they are.
    st.sampled_from([np.dtype(">i4"), np.dtype(">f8"), np.dtype(">U3")]),
)
_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


@st.composite
def _extra_dtype_arrays(
    draw: st.DrawFn, shapes: st.SearchStrategy[tuple[int, ...]] = _shapes
) -> np.ndarray[Any, Any]:
    """bfloat16/float8 arrays with arbitrary bit patterns (NaNs, infinities, subnormals)."""
    dtype = draw(st.sampled_from(EXTRA_DTYPES))
    shape = draw(shapes)
    count = math.prod(shape) * dtype.itemsize
    raw = draw(st.binary(min_size=count, max_size=count))
    return np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape)


def _non_contiguous(array: np.ndarray[Any, Any], how: str) -> np.ndarray[Any, Any]:
    if how == "transpose":
        return array.T
    if how == "reversed" and array.ndim:
        return array[::-1]
    if how == "strided" and array.ndim:
        return array[::2]
    if how == "fortran":
        return np.asfortranarray(array)
    return array


_contiguous_arrays = st.one_of(hnp.arrays(_numpy_dtypes, _shapes), _extra_dtype_arrays())
_arrays = st.builds(
    _non_contiguous,
    _contiguous_arrays,
    st.sampled_from(["as-is", "transpose", "reversed", "strided", "fortran"]),
)
_numpy_scalars = st.one_of(hnp.arrays(_numpy_dtypes, ()), _extra_dtype_arrays(st.just(()))).map(
    lambda array: array[()]
)
_python_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.none(),
)
_keys = st.one_of(st.text(max_size=5), st.integers(min_value=-(2**63), max_value=2**64 - 1))
_trees = st.recursive(
    st.one_of(_arrays, _numpy_scalars, _python_scalars),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(_keys, children, max_size=3),
    ),
    max_leaves=8,
)


# --- round trips ---


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trees)
def test_any_tree_decodes_to_an_equal_tree(tree: Any) -> None:
    _assert_same_tree(decode(encode(tree)), tree)


@settings(max_examples=200, deadline=None)
@given(_arrays)
def test_any_array_keeps_dtype_shape_and_values(array: np.ndarray[Any, Any]) -> None:
    _assert_same_array(decode(encode(array)), array)


@pytest.mark.parametrize(
    "dtype", [*sorted(_EXTRA_DTYPES), "int8", "uint64", "float16", "complex128"]
)
def test_every_supported_dtype_round_trips_by_value(dtype: str) -> None:
    original = np.arange(6).reshape(2, 3).astype(_EXTRA_DTYPES.get(dtype, dtype))
    decoded = decode(encode({"x": original}))["x"]
    assert decoded.dtype == original.dtype
    assert decoded.shape == (2, 3)
    assert decoded.tolist() == original.tolist()
    assert decoded[1, 2] == original.dtype.type(5)


@pytest.mark.parametrize(
    "value",
    [
        *(0, -1, 2**63 - 1, -(2**63), 2**64 - 1),
        *(1.5, -0.0, math.inf, -math.inf, True, False),
        *("héllo", b"\x00\xff", None, [], (), {}),
    ],
)
def test_python_scalars_keep_type_and_value(value: Any) -> None:
    decoded = decode(encode(value))
    assert type(decoded) is type(value)
    assert decoded == value


def test_nan_stays_a_float_nan() -> None:
    decoded = decode(encode([math.nan]))
    assert type(decoded[0]) is float
    assert math.isnan(decoded[0])


@pytest.mark.parametrize(
    "scalar",
    [
        *(np.float32(1.5), np.int64(-3), np.uint64(2**64 - 1), np.bool_(True)),
        *(np.str_("ab"), np.bytes_(b"xy"), np.complex64(1 + 2j), ml_dtypes.bfloat16(2.5)),
    ],
)
def test_numpy_scalars_come_back_as_zero_dimensional_arrays(scalar: np.generic) -> None:
    decoded = decode(encode(scalar))
    assert isinstance(decoded, np.ndarray)
    assert decoded.shape == ()
    assert decoded.dtype == np.asarray(scalar).dtype
    assert decoded[()] == scalar


def test_tuples_stay_tuples_and_lists_stay_lists() -> None:
    decoded = decode(encode({"t": (1, [2, (3,)]), 7: [(), [()]]}))
    assert decoded == {"t": (1, [2, (3,)]), 7: [(), [()]]}
    assert type(decoded["t"]) is tuple
    assert type(decoded["t"][1]) is list
    assert type(decoded["t"][1][1]) is tuple
    assert type(decoded[7][1][0]) is tuple


def test_non_contiguous_arrays_decode_to_their_logical_contents() -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    decoded = decode(encode((base.T, base[::-1, ::2], base[:0])))
    assert decoded[0].tolist() == base.T.tolist()
    assert decoded[1].tolist() == [[18, 20, 22], [12, 14, 16], [6, 8, 10], [0, 2, 4]]
    assert decoded[2].shape == (0, 6)


# --- zero copy ---


def _sample() -> dict[str, Any]:
    return {
        "a": np.arange(5, dtype=np.int16),
        "b": (np.ones((3, 2), dtype=np.float64), np.array(7, dtype=np.uint8)),
        "c": [np.zeros(0, dtype=np.float32), "text", np.array([True, False])],
    }


def _arrays_in(tree: Any) -> list[np.ndarray[Any, Any]]:
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, list | tuple):
        return [array for item in tree for array in _arrays_in(item)]
    return []


def _address(array: np.ndarray[Any, Any]) -> int:
    address: int = array.__array_interface__["data"][0]
    return address


def test_decoded_arrays_are_read_only_aligned_views_of_a_bytes_buffer() -> None:
    buffer = encode(_sample())
    whole = np.frombuffer(buffer, np.uint8)
    arrays = _arrays_in(decode(buffer))
    assert len(arrays) == 5
    for array in arrays:
        if array.size:
            assert np.shares_memory(array, whole)
        assert not array.flags.writeable
        assert (_address(array) - _address(whole)) % 64 == 0
    with pytest.raises(ValueError, match="read-only"):
        arrays[0][0] = 1


def test_decoding_a_bytearray_gives_views_of_it() -> None:
    buffer = bytearray(encode(_sample()))
    decoded = decode(buffer)
    _assert_same_tree(decoded, _sample())
    whole = np.frombuffer(buffer, np.uint8)
    assert np.shares_memory(decoded["a"], whole)
    assert (_address(decoded["a"]) - _address(whole)) % 64 == 0


def test_decoding_a_memoryview_slice_gives_views_aligned_to_its_start() -> None:
    encoded = encode(_sample())
    backing = b"\x01\x02\x03" + encoded
    view = memoryview(backing)[3:]
    decoded = decode(view)
    _assert_same_tree(decoded, _sample())
    start = _address(np.frombuffer(view, np.uint8))
    for array in _arrays_in(decoded):
        if array.size:
            assert np.shares_memory(array, np.frombuffer(backing, np.uint8))
        assert (_address(array) - start) % 64 == 0


# --- encode refuses ---


class _Custom:
    pass


class _Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (np.array([1, "a"], dtype=object), "object"),
        (np.zeros(2, dtype="i4,f8"), r"\('f0', '<i4'\)"),
        (np.zeros(2, dtype="V8"), "V8"),
        (np.zeros(2, dtype="M8[s]"), "datetime64"),
        (np.zeros(2, dtype=ml_dtypes.float8_e4m3fnuz), "float8_e4m3fnuz"),
        ({1, 2}, "set"),
        (frozenset(), "frozenset"),
        (_Custom(), "_Custom"),
        (_Colour.RED, "_Colour"),
        (1 + 2j, "complex"),
        (datetime.date(2024, 1, 1), "date"),
        (decimal.Decimal(1), "Decimal"),
        (2**64, "int"),
        (-(2**63) - 1, "int"),
        ({"deep": [(1, 2**70)]}, "int"),
    ],
)
def test_encode_refuses_what_it_cannot_carry(value: Any, named: str) -> None:
    with pytest.raises(CodecError, match=named):
        encode(value)


def test_encode_refuses_a_str_that_is_not_valid_unicode() -> None:
    with pytest.raises(CodecError):
        encode({"key": "lone surrogate \ud800"})


# --- decode refuses ---


def _assert_refused(buffer: bytes, match: str | None = None) -> None:
    with pytest.raises(CodecError, match=match):
        decode(buffer)


@pytest.mark.parametrize("buffer", [b"", b"L", b"LDX1", b"LDX1\x00\x00\x00"])
def test_decode_refuses_buffers_too_short_for_a_prefix(buffer: bytes) -> None:
    _assert_refused(buffer, "too short")


def test_decode_refuses_a_wrong_magic() -> None:
    _assert_refused(b"LDX2" + encode([1])[4:], "magic")


def test_decode_refuses_a_header_length_past_the_end() -> None:
    _assert_refused(struct.pack("<4sI", MAGIC, 2**32 - 1) + b"\x90", "header declares")


def test_every_truncation_of_an_encoding_is_refused() -> None:
    full = encode({"t": (1, "x"), "a": np.arange(6, dtype=np.int32).reshape(2, 3), "n": None})
    for length in range(len(full)):
        _assert_refused(full[:length])
    _assert_same_tree(decode(full)["a"], np.arange(6, dtype=np.int32).reshape(2, 3))


@pytest.mark.parametrize(
    "body", [b"\xc1", b"\xff" * 8, b"\x92\x01", b"\x81\xa1k", b"\xdb\xff\xff\xff\xff"]
)
def test_decode_refuses_garbage_after_a_valid_prefix(body: bytes) -> None:
    _assert_refused(struct.pack("<4sI", MAGIC, len(body)) + body, "malformed header")


def test_decode_refuses_bytes_left_over_inside_the_header() -> None:
    _assert_refused(_buffer(_header([1, 2]) + b"\x03"), "malformed header")


def _array_buffer(dtype: Any, shape: Any, offset: Any, nbytes: Any, data: bytes) -> bytes:
    return _buffer(_header({"x": _array_ext(dtype, shape, offset, nbytes)}), data)


def test_a_hand_built_array_decodes_to_a_view_of_its_bytes() -> None:
    data = bytes(range(64)) + np.arange(4, dtype="<i4").tobytes()
    decoded = decode(_array_buffer("<i4", [2, 2], 64, 16, data))
    assert decoded["x"].tolist() == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    ("dtype", "shape", "offset", "nbytes", "match"),
    [
        ("<i4", [2, 2], 0, 15, "cannot be 15 bytes"),
        ("<i4", [2, 2], 0, 17, "cannot be 17 bytes"),
        ("<i4", [2, 2], 0, -16, "cannot be -16 bytes"),
        ("<i4", [2, 2], 64, 16, "runs past the end"),
        ("<i4", [2, 2], 2**63, 16, "runs past the end"),
        ("<i4", [2, 2], -64, 16, "malformed array extent"),
        ("<i4", [2, 2], 1.0, 16, "malformed array extent"),
        ("<i4", [2, 2], 0, "16", "malformed array extent"),
        ("<i4", [2, -2], 0, 16, "malformed array shape"),
        ("<i4", [2, 2.0], 0, 16, "malformed array shape"),
        ("<i4", 4, 0, 16, "malformed array shape"),
        ("<i4", [1] * (MAX_DIMENSIONS + 1), 0, 4, "malformed array shape"),
        ("|u1", [2**40, 2**40], 0, 2**63, "cannot be"),
        ("|u1", [2**20, 2**20], 0, 2**40, "runs past the end"),
        ("|u1", [2**31, 2**31, 2], 0, 2**63, "runs past the end"),
        ("O", [1], 0, 8, "not allowed"),
        ("|O", [1], 0, 8, "not allowed"),
        ("|V8", [1], 0, 8, "not allowed"),
        ("<M8[s]", [1], 0, 8, "not allowed"),
        ("int32", [1], 0, 4, "not allowed"),
        ("not-a-dtype", [1], 0, 4, "is not allowed"),
        ("float8_e4m3fnuz", [1], 0, 1, "not allowed"),
        (4, [1], 0, 4, "must be a string"),
        (None, [1], 0, 4, "must be a string"),
        (["<i4"], [1], 0, 4, "must be a string"),
    ],
)
def test_decode_refuses_an_array_descriptor_that_lies(
    dtype: Any, shape: Any, offset: Any, nbytes: Any, match: str
) -> None:
    _assert_refused(_array_buffer(dtype, shape, offset, nbytes, bytes(64)), match)


@pytest.mark.parametrize("dtype", ["|S0", "<U0"])
@pytest.mark.parametrize("shape", [[3], [2**40, 2**40], [2**63], [0, 2**63]])
def test_decode_refuses_zero_width_string_dtypes_at_any_shape(dtype: str, shape: list[int]) -> None:
    _assert_refused(_array_buffer(dtype, shape, 0, 0, bytes(64)))


@pytest.mark.parametrize("dtype", [",", ",i4", "(,)", "a5", "S-1", "(2)i4", "i4,i4", "\x00"])
def test_decode_refuses_dtype_strings_that_are_not_canonical(dtype: str) -> None:
    _assert_refused(_array_buffer(dtype, [1], 0, 4, bytes(64)), "dtype")


@pytest.mark.parametrize("descriptor", [b"", b"\x93\xa3<i4\x91\x01\x00", b"\xc1", b"\x01"])
def test_decode_refuses_a_malformed_array_descriptor(descriptor: bytes) -> None:
    _assert_refused(_buffer(_header([msgpack.ExtType(1, descriptor)]), bytes(64)))


def test_decode_of_a_huge_declared_shape_fails_without_allocating() -> None:
    buffers = [
        _array_buffer("<f8", [2**40, 2**40], 0, 2**63, bytes(64)),
        _array_buffer("<f8", [2**30, 2**30], 0, 2**63, bytes(64)),
        _array_buffer("|u1", [0, 2**40, 2**40], 0, 0, bytes(64)),
    ]
    tracemalloc.start()
    try:
        for buffer in buffers:
            _assert_refused(buffer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@pytest.mark.parametrize("code", [0, 3, 42, 127])
def test_decode_refuses_an_unknown_extension_code(code: int) -> None:
    _assert_refused(_buffer(_header([msgpack.ExtType(code, b"\x90")])), f"extension type {code}")


def test_decode_refuses_the_msgpack_timestamp_extension() -> None:
    # fixext 4 with type -1: msgpack's own Timestamp, which encode never writes.
    _assert_refused(_buffer(b"\x91\xd6\xff\x00\x00\x00\x01"))


@pytest.mark.parametrize("items", [5, "abc", {"a": 1}, None])
def test_decode_refuses_a_tuple_extension_that_does_not_hold_a_list(items: Any) -> None:
    _assert_refused(
        _buffer(_header([msgpack.ExtType(2, msgpack.packb(items))])), "must hold a list"
    )


def _nested_tuples(levels: int) -> tuple[Any, ...]:
    tree: tuple[Any, ...] = ()
    for _ in range(levels - 1):
        tree = (tree,)
    return tree


def test_tuples_nested_up_to_max_depth_decode_and_deeper_ones_are_refused() -> None:
    buffer = encode(_nested_tuples(6))
    assert decode(buffer, max_depth=6) == _nested_tuples(6)
    with pytest.raises(CodecError, match="deeper than 5 levels"):
        decode(buffer, max_depth=5)
    with pytest.raises(CodecError, match="deeper than 0 levels"):
        decode(buffer, max_depth=0)


def test_default_max_depth_refuses_a_deep_tuple_tree() -> None:
    with pytest.raises(CodecError, match="deeper than 32 levels"):
        decode(encode(_nested_tuples(33)))
    assert decode(encode(_nested_tuples(32))) == _nested_tuples(32)


# --- fuzzing ---

_SEEDS = [
    encode(_sample()),
    encode({"x": np.arange(12, dtype="<f4").reshape(3, 4), "t": (1, (2, "three")), 4: b"b"}),
    encode([np.array(1.5, dtype=ml_dtypes.bfloat16), np.array(["ab", "c"]), None, 2**64 - 1]),
    encode((np.zeros((0, 3), dtype=np.int64), {"s": np.array([b"xy"])})),
]
_mutation = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
    st.integers(min_value=0, max_value=2**16),
    st.integers(min_value=0, max_value=255),
)


def _mutate(seed: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(seed)
    for kind, position, value in mutations:
        at = position % (len(data) + 1)
        if kind == "insert":
            data[at:at] = bytes([value])
        elif not data:
            continue
        elif kind == "truncate":
            del data[at:]
        elif kind == "delete":
            del data[at % len(data)]
        elif kind == "flip":
            data[at % len(data)] ^= 1 << (value % 8)
        else:
            data[at % len(data)] = value
    return bytes(data)


def _decode_or_refuse(buffer: bytes) -> None:
    """decode either returns a tree of the codec's own types or raises CodecError."""
    with contextlib.suppress(CodecError):
        _assert_only_codec_types(decode(buffer))


# The fuzz tests are derandomized: every run tries the same inputs, so a failure reproduces.
# Fuzz inputs per run: 2,000 mutated encodings, 500 random buffers, 500 random buffers behind
# the magic, 1,000 random headers behind a valid prefix and 1,000 random array descriptors:
# 5,000 decode inputs; and 300 trees with a disallowed leaf for encode.


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(st.sampled_from(_SEEDS), st.lists(_mutation, min_size=1, max_size=6))
def test_decode_of_a_mutated_encoding_returns_or_raises_codec_error(
    seed: bytes, mutations: list[tuple[str, int, int]]
) -> None:
    _decode_or_refuse(_mutate(seed, mutations))


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.binary(max_size=300))
def test_decode_of_random_bytes_returns_or_raises_codec_error(buffer: bytes) -> None:
    _decode_or_refuse(buffer)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.binary(max_size=300))
def test_decode_of_random_bytes_after_the_magic_raises_codec_error(body: bytes) -> None:
    # Random bytes starting with the magic: the header length is almost never right.
    _decode_or_refuse(MAGIC + body)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_decode_of_a_random_header_returns_or_raises_codec_error(
    header: bytes, data: bytes
) -> None:
    _decode_or_refuse(_buffer(header, data))


_descriptor_dtypes = st.one_of(
    st.sampled_from(["<i4", "|u1", "<f8", "|S0", "<U0", "|S3", "bfloat16", "O", "|V8"]),
    st.text(max_size=6),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.none(),
)
_descriptor_ints = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, 1, 64, 2**31, 2**32, 2**62, 2**63, 2**64 - 1]),
)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(
    _descriptor_dtypes,
    st.one_of(st.lists(_descriptor_ints, max_size=MAX_DIMENSIONS + 2), _descriptor_ints),
    _descriptor_ints,
    _descriptor_ints,
    st.integers(min_value=0, max_value=256),
)
def test_decode_of_random_array_descriptors_returns_or_raises_codec_error(
    dtype: Any, shape: Any, offset: Any, nbytes: Any, data_size: int
) -> None:
    _decode_or_refuse(_array_buffer(dtype, shape, offset, nbytes, bytes(data_size)))


_good_leaves = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=4),
    st.none(),
    hnp.arrays(np.int16, hnp.array_shapes(min_dims=0, max_side=3)),
)
_bad_leaves = st.one_of(
    st.sampled_from(
        [
            {1},
            frozenset({2}),
            _Custom(),
            _Colour.RED,
            3j,
            datetime.date(2024, 1, 1),
            np.array([None], dtype=object),
            np.zeros(3, dtype="i2,i2"),
            np.zeros(1, dtype="V2"),
            np.zeros(2, dtype="m8[s]"),
        ]
    ),
    st.integers(min_value=2**64),
    st.integers(max_value=-(2**63) - 1),
)


def _containing(bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Containers that hold at least one subtree drawn from `bad`, among good leaves."""
    placed = st.builds(
        lambda item, others, at: [*others[:at], item, *others[at:]],
        bad,
        st.lists(_good_leaves, max_size=3),
        st.integers(min_value=0, max_value=3),
    )
    return st.one_of(
        placed,
        placed.map(tuple),
        st.builds(
            lambda item, others, key: {**others, key: item},
            bad,
            st.dictionaries(st.text(max_size=3), _good_leaves, max_size=3),
            st.text(max_size=3),
        ),
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.recursive(_bad_leaves, _containing, max_leaves=6))
def test_encode_of_a_tree_with_a_disallowed_leaf_raises_codec_error(tree: Any) -> None:
    with pytest.raises(CodecError, match="cannot encode"):
        encode(tree)
