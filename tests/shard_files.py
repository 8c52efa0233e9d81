"""Tar shards (WebDataset's layout) and TFRecord files for the shard sources' tests, written
with the standard library's `tarfile` and the `tfrecord` package's writer."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image
from tfrecord import TFRecordWriter

SAMPLES = 7  # per shard: batches of 3 start and end inside shards


def png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def npy(seed: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(seed % 5 + 1, dtype=np.int16))
    return buffer.getvalue()


def sample_files(number: int) -> list[tuple[str, bytes]]:
    """The files of sample `number`: one of each field kind, a multi-dot field, zero bytes."""
    key = f"part/{number:05d}"
    return [
        (f"{key}.png", png(number)),
        (f"{key}.cls", str(number % 4).encode()),
        (f"{key}.json", json.dumps({"n": number}).encode()),
        (f"{key}.npy", npy(number)),
        (f"{key}.seg.TXT", b"text\x00" * (number % 3)),
    ]


def add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    archive.addfile(member, io.BytesIO(data))


def write_tar_shards(directory: Path, shards: int) -> list[Path]:
    """`shards` shards of `SAMPLES` samples, with what webdataset skips between them: a
    directory, its metadata file and a name without an extension."""
    paths = []
    for shard in range(shards):
        path = directory / f"shard-{shard:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
            add(archive, "__meta__/info.json", b"{}")
            directory_member = tarfile.TarInfo("part")
            directory_member.type = tarfile.DIRTYPE
            archive.addfile(directory_member)
            for number in range(shard * SAMPLES, (shard + 1) * SAMPLES):
                for name, data in sample_files(number):
                    add(archive, name, data)
            add(archive, "README", b"no extension: not a sample")
        paths.append(path)
    return paths


def write_tfrecords(directory: Path, files: int) -> list[Path]:
    """`files` files of `SAMPLES` tf.train.Examples of every feature kind."""
    paths = []
    for file in range(files):
        path = directory / f"train-{file:03d}.tfrecord"
        writer = TFRecordWriter(str(path))
        for number in range(file * SAMPLES, (file + 1) * SAMPLES):
            writer.write(
                {
                    "label": (number, "int"),
                    "vector": ([number / 2, -1.5, 3.25][: number % 3 + 1], "float"),
                    "image": (png(number), "byte"),
                    "tags": ([b"a\x00", b"b"], "byte"),
                }
            )
        writer.close()
        paths.append(path)
    return paths
