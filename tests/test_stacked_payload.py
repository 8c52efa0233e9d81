"""A batch stacked as its payload (`PooledPayload`, the worker's memory for a socket's reply) is
checksummed as its frames are, whatever they turn out to be: the chunks hashed as it was stacked
count only if the frames are that batch, and a reply of another kind is not laid out at all.
(That the loading threads hash the chunks: `test_shared_memory_stacking`.)"""

from __future__ import annotations

import jax
import numpy as np

from loadax.wire import checksum
from loadax.wire.codec import encode_frames
from loadax.wire.stacked_payload import PooledPayload
from loadax.wire.v1 import worker_pb2 as wire

CHUNKS = wire.CHECKSUM_XXH3_CHUNKS


def test_a_payload_encoded_otherwise_than_stacked_is_summed_over_its_frames() -> None:
    tree = {"x": np.arange(70_000.0).reshape(2, 35_000)}  # 560 KB: 3 chunks
    structure = jax.tree.structure(tree)
    kinds = [((2, 35_000), np.dtype(np.float64))]
    stacked = PooledPayload(CHUNKS)
    leaves = stacked.leaves(structure, kinds)
    assert leaves is not None
    for row in range(2):
        leaves[0][row] = tree["x"][row]
        stacked.stacked(0, row, row + 1)
    frames = encode_frames({"x": leaves[0]})
    assert stacked.checksum(frames) == checksum.payload_checksum(encode_frames(tree), CHUNKS)
    # Its rows encoded again after another leaf: not the batch stacked, its frames hashed.
    moved = PooledPayload(CHUNKS)
    leaves = moved.leaves(structure, kinds)
    assert leaves is not None
    leaves[0][:] = tree["x"]
    moved.stacked(0, 0, 2)
    frames = encode_frames({"a": np.ones(3), "x": leaves[0][1:]})
    expected = encode_frames({"a": np.ones(3), "x": tree["x"][1:]})
    assert moved.checksum(frames) == checksum.payload_checksum(expected, CHUNKS)
    # A batch over its largest size, or answered with another kind, is stacked elsewhere.
    assert PooledPayload(CHUNKS, 1 << 10).leaves(structure, kinds) is None
    assert PooledPayload(wire.CHECKSUM_XXH3_64).leaves(structure, kinds) is None
