"""The codec workload: `loadax.wire.codec` on a W2 batch (64 float32 224x224x3 images and their
labels): `encode_frames` (out-of-band array buffers, as ZeroMQ sends them), `encode` (one joined
buffer, as gRPC sends it) and `decode`, against a memcpy of the same bytes into a preallocated
array."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from harness import Setup, System, Trial, main
from workloads import CROP_SIDE, SEED

from loadax.wire.codec import decode, encode, encode_frames


def w2_batch(size: int) -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(SEED)
    return {
        "image": rng.random((size, CROP_SIDE, CROP_SIDE, 3), dtype=np.float32),
        "label": np.arange(size, dtype=np.int64),
    }


def encoding(setup: Setup) -> Trial:
    batch = w2_batch(setup.workload.batch_size)

    def encoded() -> Iterator[npt.NDArray[np.uint8]]:
        for _ in range(setup.workload.records):
            yield np.frombuffer(encode(batch), dtype=np.uint8)

    return Trial(encoded)


def framing(setup: Setup) -> Trial:
    batch = w2_batch(setup.workload.batch_size)

    def framed() -> Iterator[list[npt.NDArray[np.uint8]]]:
        for _ in range(setup.workload.records):
            yield [np.frombuffer(frame, dtype=np.uint8) for frame in encode_frames(batch)]

    return Trial(framed)


def decoding(setup: Setup) -> Trial:
    buffer = encode(w2_batch(setup.workload.batch_size))

    def decoded() -> Iterator[Any]:
        for _ in range(setup.workload.records):
            yield decode(buffer)

    return Trial(decoded)


def memcpy(setup: Setup) -> Trial:
    batch = w2_batch(setup.workload.batch_size)
    copies = {key: array.copy() for key, array in batch.items()}  # preallocated and paged in

    def copied() -> Iterator[dict[str, npt.NDArray[Any]]]:
        for _ in range(setup.workload.records):
            for key, array in batch.items():
                np.copyto(copies[key], array)
            yield copies

    return Trial(copied)


SYSTEMS: dict[str, System] = {
    "loadax.wire.codec encode_frames": framing,
    "loadax.wire.codec encode": encoding,
    "loadax.wire.codec decode": decoding,
    "memcpy": memcpy,
}

if __name__ == "__main__":
    main(SYSTEMS)
