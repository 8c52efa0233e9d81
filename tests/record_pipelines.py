"""Pipeline factories over Hugging Face and ArrayRecord files, written into `directory`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

import loadax
from loadax.sources.arrayrecord import ArrayRecordDataset
from loadax.sources.huggingface import HuggingFaceDataset

WIDTH = 6  # floats in each record's "x"
FEATURES = datasets.Features(
    {"x": datasets.List(datasets.Value("float32"), length=WIDTH), "label": datasets.Value("int64")}
)


def row_values(records: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Row i: x = row i of `records` x 6 float32 numbers drawn from seed 0, label = i % 7."""
    x = np.random.default_rng(0).random((records, WIDTH), dtype=np.float32)
    return x, np.arange(records, dtype=np.int64) % 7


def encode_row(x: np.ndarray[Any, Any], label: int) -> bytes:
    """A record's bytes: the label as little-endian int64, then x as little-endian float32."""
    return np.array([label], dtype="<i8").tobytes() + np.asarray(x, dtype="<f4").tobytes()


def decode_row(record: bytes) -> dict[str, Any]:
    """The inverse of `encode_row`, as {"x": float32 array, "label": int64}."""
    return {
        "x": np.frombuffer(record, dtype="<f4", offset=8).astype(np.float32),
        "label": np.frombuffer(record, dtype="<i8", count=1)[0].astype(np.int64),
    }


def write_huggingface_rows(directory: str | os.PathLike[str], records: int = 40) -> Path:
    """`hf_rows/`, a `save_to_disk` dataset: {"x": 6 float32, "label": int64} per `row_values`."""
    path = Path(directory) / "hf_rows"
    if not path.exists():
        x, labels = row_values(records)
        partial = path.with_name(f"hf_rows.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        datasets.Dataset.from_dict({"x": x, "label": labels}, features=FEATURES).save_to_disk(
            str(partial)
        )
        _publish(partial, path)
    return path


def write_arrayrecord_rows(
    directory: str | os.PathLike[str], records: int = 40, files: int = 2
) -> list[Path]:
    """`rows-K-of-N.arrayrecord`: the `row_values` rows as `encode_row` bytes, split over files."""
    x, labels = row_values(records)
    paths = []
    for number, chunk in enumerate(np.array_split(np.arange(records), files)):
        path = Path(directory) / f"rows-{number:05d}-of-{files:05d}.arrayrecord"
        if not path.exists():
            partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
            writer = ArrayRecordWriter(str(partial), "group_size:1")
            for index in chunk.tolist():
                writer.write(encode_row(x[index], int(labels[index])))
            writer.close()
            os.replace(partial, path)  # a worker and a test may both write it: all or nothing
        paths.append(path)
    return paths


def huggingface_rows(directory: str, records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Record i is row i of `hf_rows/` in numpy format: {"x": float32[6], "label": int64}."""
    dataset = HuggingFaceDataset.load_from_disk(
        write_huggingface_rows(directory, records), format="numpy"
    )
    return loadax.Pipeline(dataset, loadax.Batcher())


def arrayrecord_rows(directory: str, records: int = 40) -> loadax.Pipeline[Any, Any]:
    """Record i is record i of the `rows-*.arrayrecord` files, decoded by `decode_row`."""
    dataset = ArrayRecordDataset(write_arrayrecord_rows(directory, records), decode=decode_row)
    return loadax.Pipeline(dataset, loadax.Batcher())


def _publish(partial: Path, path: Path) -> None:
    """Rename the finished directory `partial` to `path`, unless another process got there first."""
    try:
        os.rename(partial, path)
    except OSError:
        if not path.exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)
