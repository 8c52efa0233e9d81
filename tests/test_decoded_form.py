"""loadax.wire.decoded_form: a tree as the codec gives it back, without its bytes, exactly: the same
node types, keys, dtypes, shapes, bytes and flags as `decode_frames(encode_frames(tree))`, with the
same memory under each array, and the codec's own error for what it refuses."""

from __future__ import annotations

import collections
import math
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_codec import _trees as trees

from loadax.wire.codec import MAX_DEPTH, CodecError, decode_frames, encode_frames
from loadax.wire.decoded_form import decoded_form


def assert_same_form(handed: Any, decoded: Any, original: Any) -> None:
    """`handed` is `decoded` (`original` through the codec) in every node's type, key, dtype,
    shape, byte and flag, and each array lies where the decoded one does: in the original's
    memory unless encoding copied it (to make it C-contiguous, or an array of a numpy scalar)."""
    assert type(handed) is type(decoded)
    if isinstance(decoded, np.ndarray):
        assert (handed.dtype, handed.dtype.str, handed.shape) == (
            decoded.dtype,
            decoded.dtype.str,
            decoded.shape,
        )
        assert handed.flags.c_contiguous
        # An empty array has nothing to write: where decoding reads it from decides its flag.
        assert handed.flags.writeable == decoded.flags.writeable or not decoded.nbytes
        assert handed.tobytes() == decoded.tobytes()
        if decoded.nbytes and isinstance(original, np.ndarray) and original.flags.c_contiguous:
            assert np.shares_memory(handed, original)
            assert np.shares_memory(decoded, original)
    elif isinstance(decoded, dict):
        assert [(type(key), key) for key in handed] == [(type(key), key) for key in decoded]
        for key, value in decoded.items():
            assert_same_form(handed[key], value, original[key])
    elif isinstance(decoded, list | tuple):
        assert len(handed) == len(decoded)
        for each in zip(handed, decoded, original, strict=True):
            assert_same_form(*each)
    elif isinstance(decoded, float) and math.isnan(decoded):
        assert math.isnan(handed)
    else:
        assert handed == decoded


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_any_tree_is_handed_over_in_the_form_the_codec_gives_it_back(tree: Any) -> None:
    assert_same_form(decoded_form(tree), decode_frames(encode_frames(tree)), tree)


Pair = collections.namedtuple("Pair", "left right")


@pytest.mark.parametrize(
    "tree",
    [
        {"image": np.zeros((4, 3, 2), ml_dtypes.bfloat16), "label": np.arange(4, dtype=">i2")},
        {"t": np.arange(12.0).reshape(3, 4).T, "s": np.float32(1.5), "u": np.str_("cat")},
        Pair(np.zeros(2, np.uint8), [1, 2**64 - 1, -(2**63), True, None, b"\x00", "é"]),
        {(1, 2): np.zeros(1)},  # a tuple key: the codec's own way
        {1: "a", 2.5: "b", None: "c", b"k": "d", "text": np.array(["ab", "c"])},
        collections.OrderedDict(x=1),
        ((((np.ones(1),),),),),
        np.arange(6).reshape(2, 3)[:, ::2],
    ],
    ids=lambda tree: type(tree).__name__,
)
def test_batches_of_every_kind_are_handed_over_in_the_codecs_form(tree: Any) -> None:
    try:
        decoded = decode_frames(encode_frames(tree))
    except CodecError as error:
        with pytest.raises(CodecError, match=str(error)):
            decoded_form(tree)
        return
    assert_same_form(decoded_form(tree), decoded, tree)


def test_a_c_contiguous_array_is_handed_over_itself() -> None:
    image = np.zeros((2, 3), np.float32)
    read_only = np.frombuffer(bytes(8), np.int64)
    form = decoded_form({"image": image, "ids": [read_only]})
    assert form["image"] is image
    assert form["ids"][0] is read_only


def nested(depth: int) -> Any:
    tree: Any = np.ones(1)
    for _ in range(depth):
        tree = (tree,)
    return tree


@pytest.mark.parametrize(
    "tree",
    [
        {"x": np.zeros(2, dtype=object)},
        {"x": np.zeros(2, dtype="M8[s]")},
        {"x": jnp.zeros(2)},
        {"x": 2**64},
        {"x": complex(1, 2)},
        {"x": "\ud800"},  # a lone surrogate: no UTF-8
        {"x": np.zeros(1), "y": collections.OrderedDict(z=1)},
        nested(MAX_DEPTH + 2),
    ],
    ids=["object", "datetime", "jax", "int", "complex", "surrogate", "ordered", "deep"],
)
def test_what_the_codec_refuses_is_refused_with_its_own_error(tree: Any) -> None:
    with pytest.raises(CodecError) as codec:
        decode_frames(encode_frames(tree))
    with pytest.raises(CodecError) as handed:
        decoded_form(tree)
    assert str(handed.value) == str(codec.value)
