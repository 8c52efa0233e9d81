"""tf.data, the peer: W1, W2 and W3 locally, and R1 through a tf.data service on loopback.

The work is done with TF's own ops (its image ops and FFT), as a tf.data user would write it;
records are read straight from the same .npy files as raw fixed-length records. Runs in the
peers' environment.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from harness import Setup, System, Trial, main
from workloads import CROP_SIDE, IMAGE_SIDE, SEED, W2_RECORD, W3_KEEP, W3_SIDE, data_offset

# By name: TensorFlow lives in the peers' environment only, not where mypy checks this file.
tf: Any = importlib.import_module("tensorflow")

IMAGE_BYTES = IMAGE_SIDE * IMAGE_SIDE * 3


def w2_dataset(setup: Setup) -> Any:
    """W2 read in chunks of one batch (so a tf.data service can split the work dynamically)."""
    spec = setup.workload
    path, size = str(spec.data_file()), W2_RECORD.itemsize
    offset, total, chunk = data_offset(spec.data_file()), spec.records, spec.batch_size

    def read_chunk(first: Any) -> Any:
        count = tf.minimum(tf.constant(chunk, tf.int64), total - first)
        records = tf.data.FixedLengthRecordDataset(
            path,
            size,
            header_bytes=offset + first * size,
            footer_bytes=(total - first - count) * size,
        )
        return tf.data.Dataset.zip((tf.data.Dataset.range(first, first + count), records))

    def augment(index: Any, raw: Any) -> dict[str, Any]:
        data = tf.io.decode_raw(raw, tf.uint8)
        image = tf.reshape(data[:IMAGE_BYTES], (IMAGE_SIDE, IMAGE_SIDE, 3))
        label = tf.bitcast(tf.reshape(data[IMAGE_BYTES:], (8,)), tf.int64)
        seed = tf.stack([tf.constant(SEED, tf.int64), index])
        crop = tf.image.stateless_random_crop(image, (CROP_SIDE, CROP_SIDE, 3), seed=seed)
        crop = tf.image.stateless_random_flip_left_right(crop, seed=seed)
        return {"image": tf.cast(crop, tf.float32) * (1 / 255) - 0.5, "label": label}

    chunks = tf.data.Dataset.range(0, total, chunk)
    return chunks.flat_map(read_chunk).map(augment, num_parallel_calls=tf.data.AUTOTUNE)


def w3_dataset(setup: Setup) -> Any:
    spec = setup.workload
    path = spec.data_file()
    records = tf.data.FixedLengthRecordDataset(
        str(path), W3_SIDE * W3_SIDE * 4, header_bytes=data_offset(path)
    )

    def transform(raw: Any) -> Any:
        x = tf.reshape(tf.io.decode_raw(raw, tf.float32), (W3_SIDE, W3_SIDE))
        return tf.abs(tf.signal.fft2d(tf.cast(x, tf.complex64)))[:W3_KEEP, :W3_KEEP]

    return records.map(transform, num_parallel_calls=tf.data.AUTOTUNE)


def batched(setup: Setup) -> Any:
    spec = setup.workload
    if spec.name == "W1":
        records = tf.data.Dataset.range(spec.records)
    elif spec.name in ("W2", "R1"):
        records = w2_dataset(setup)
    elif spec.name == "W3":
        records = w3_dataset(setup)
    else:
        raise ValueError(f"tf.data runs W1, W2, W3 and R1, not {spec.name}")
    return records.batch(spec.batch_size).prefetch(tf.data.AUTOTUNE)


def local(setup: Setup) -> Trial:
    def batches() -> Iterable[Any]:
        iterator: Iterable[Any] = batched(setup).as_numpy_iterator()
        return iterator

    return Trial(batches)


def service(setup: Setup) -> Trial:
    """The dataset run by the service's workers (which split it dynamically), uncompressed:
    faster than the default compression on loopback."""
    distribute = tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=f"grpc://{setup.option('dispatcher')}",
        compression=None,
    )

    def batches() -> Iterable[Any]:
        iterator: Iterable[Any] = batched(setup).apply(distribute).as_numpy_iterator()
        return iterator

    return Trial(batches)


SYSTEMS: dict[str, System] = {
    "tf.data": local,
    "tf.data service 1w": service,
    "tf.data service 2w": service,
}

if __name__ == "__main__":
    main(SYSTEMS)
