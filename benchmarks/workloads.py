"""The benchmark workloads: their sizes, their data files and their per-record work.

Every runner imports this, in every environment (loadax's, the peers', loadax 0.2.1's), so it
needs nothing but numpy. Numpy-based systems all run these same functions; tf.data runs the
same work with TF ops.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

SEED = 0
"""Seed of the per-record random crops and flips."""
IMAGE_SIDE, CROP_SIDE = 256, 224
CLASSES = 1000
W2_RECORD = np.dtype([("image", np.uint8, (IMAGE_SIDE, IMAGE_SIDE, 3)), ("label", np.int64)])
"""A W2 record: image and label side by side, so that one row of one file is one record."""
W3_SIDE, W3_KEEP = 512, 256
T1_BATCH_BYTES = {"T1": 8 << 20, "T1-64M": 64 << 20}
"""T1's workloads, by the size of their pre-built batches."""
REMOTE_PIPELINES = {"R1": "w2", "T1": "t1", "T1-64M": "t1_64m"}
"""The pipeline a `loadax-worker` serves each remote workload as (`services`' worker config)."""
SCALES = ("full", "quick", "smoke")
"""smoke: tiny, for the suite's own test."""


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """One workload at one scale: `records` read in batches of `batch_size`.

    `max_seconds` stops a run early (the rate is still elements / wall time), so that a peer
    hundreds of times slower than the others cannot hold the suite up for hours.
    """

    name: str
    records: int
    batch_size: int
    max_seconds: float
    data: Path | None = None  # the .npy file the records are read from, if any
    scale: str = "full"

    def data_file(self) -> Path:
        if self.data is None:
            raise ValueError(f"workload {self.name} reads no data file")
        return self.data


# (records, batch size) per workload and scale; T1's records are its batches, the codec's
# are batches encoded or decoded, P1's are the records of the plan, R2's are 1 KiB each.
_SIZES: dict[str, dict[str, tuple[int, int]]] = {
    "full": {
        "W1": (1_000_000, 256),
        "W2": (4096, 64),
        "W3": (1024, 32),
        "R1": (4096, 64),
        "T1": (384, 1),
        "T1-64M": (48, 1),
        "codec": (40, 64),
        "P1": (10**10, 1 << 20),
        "R2": (4096, 32),
    },
    "quick": {
        "W1": (200_000, 256),
        "W2": (512, 64),
        "W3": (128, 32),
        "R1": (512, 64),
        "T1": (64, 1),
        "T1-64M": (12, 1),
        "codec": (8, 64),
        "P1": (10**10, 1 << 20),
        "R2": (512, 32),
    },
    "smoke": {
        "W1": (5000, 256),
        "W2": (128, 64),
        "W3": (64, 32),
        "R1": (128, 64),
        "T1": (8, 1),
        "T1-64M": (2, 1),
        "codec": (2, 64),
        "P1": (10**10, 1 << 20),
        "R2": (128, 32),
    },
}
_MAX_SECONDS = {"full": 60.0, "quick": 3.0, "smoke": 3.0}
WORKLOADS = tuple(_SIZES["full"])


def workload(name: str, scale: str, data_dir: Path) -> Workload:
    """`name` at `scale` ("quick" or "full"), with its data file under `data_dir`."""
    if scale not in _SIZES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if name not in _SIZES[scale]:
        raise ValueError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)}")
    records, batch_size = _SIZES[scale][name]
    data = None
    if name in ("W2", "R1"):
        data = data_dir / f"w2-{records}.npy"
    elif name == "W3":
        data = data_dir / f"w3-{records}.npy"
    return Workload(name, records, batch_size, _MAX_SECONDS[scale], data, scale)


def prepare(spec: Workload) -> None:
    """Write the workload's data file unless it is there already (generation is not timed)."""
    if spec.data is None or spec.data.is_file():
        return
    spec.data.parent.mkdir(parents=True, exist_ok=True)
    partial = spec.data.with_suffix(".partial.npy")
    if spec.name == "W3":
        array = np.lib.format.open_memmap(
            partial, mode="w+", dtype=np.float32, shape=(spec.records, W3_SIDE, W3_SIDE)
        )
        for index in range(spec.records):
            array[index] = w3_record(index)
    else:
        array = np.lib.format.open_memmap(
            partial, mode="w+", dtype=W2_RECORD, shape=(spec.records,)
        )
        for index in range(spec.records):
            array[index] = (w2_image(index), index % CLASSES)
    array.flush()
    del array
    os.replace(partial, spec.data)


def w2_image(index: int) -> npt.NDArray[np.uint8]:
    shape = (IMAGE_SIDE, IMAGE_SIDE, 3)
    return np.random.default_rng(index).integers(0, 256, shape, dtype=np.uint8)


def w3_record(index: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(index).standard_normal((W3_SIDE, W3_SIDE), dtype=np.float32)


def open_records(spec: Workload) -> npt.NDArray[Any]:
    """The workload's data file, memory-mapped read-only."""
    array: npt.NDArray[Any] = np.load(spec.data_file(), mmap_mode="r")
    return array


def data_offset(path: Path) -> int:
    """Where the rows start in a .npy file (for readers that take raw fixed-length records)."""
    array = np.load(path, mmap_mode="r")
    return int(array.offset)


def record_rng(index: int) -> np.random.Generator:
    """The random generator of record `index` (for systems that have none of their own)."""
    return np.random.default_rng((SEED, index))


def augment(image: npt.NDArray[np.uint8], rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """W2's per-record work: a random crop and horizontal flip, then `x / 255 - 0.5`."""
    top, left = rng.integers(0, IMAGE_SIDE - CROP_SIDE + 1, size=2)
    crop = image[top : top + CROP_SIDE, left : left + CROP_SIDE]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    out = crop.astype(np.float32)
    out *= np.float32(1 / 255)
    out -= np.float32(0.5)
    return out


def w2_example(row: Any, rng: np.random.Generator) -> dict[str, Any]:
    """A W2 record (a row of the W2 file) augmented: {"image": float32 crop, "label": int64}."""
    return {"image": augment(row["image"], rng), "label": row["label"]}


def spectrum(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """W3's per-record work."""
    result: npt.NDArray[np.float32] = np.abs(np.fft.fft2(x)).astype(np.float32)
    return result[:W3_KEEP, :W3_KEEP]


class MapSource:
    """The records of a workload by index (`__len__`, `__getitem__`), as peers take them."""

    def __init__(self, length: int, read: Callable[[int], Any]) -> None:
        self._length, self._read = length, read

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        return self._read(index)


def raw_records(spec: Workload) -> MapSource:
    """The untransformed records: W1's ints, W2's rows (image and label), W3's arrays."""
    if spec.name == "W1":
        return MapSource(spec.records, int)
    rows = open_records(spec)
    return MapSource(spec.records, rows.__getitem__)


def examples(spec: Workload) -> MapSource:
    """The records with the workload's work done, each with its own `record_rng`."""
    raw = raw_records(spec)
    if spec.name == "W1":
        return raw
    if spec.name == "W2":
        return MapSource(spec.records, lambda index: w2_example(raw[index], record_rng(index)))
    if spec.name == "W3":
        return MapSource(spec.records, lambda index: spectrum(raw[index]))
    raise ValueError(f"workload {spec.name} has no records")


def stack_records(records: list[Any]) -> Any:
    """Numpy collation for the peers: dicts of arrays and scalars stack key by key."""
    first = records[0]
    if isinstance(first, dict):
        return {key: np.stack([record[key] for record in records]) for key in first}
    if isinstance(first, np.ndarray):
        return np.stack(records)
    return np.asarray(records, dtype=np.int64)


def t1_payload(size: int) -> npt.NDArray[np.uint8]:
    """One pre-built T1 batch: `size` random bytes."""
    return np.random.default_rng(SEED).integers(0, 256, size, dtype=np.uint8)
