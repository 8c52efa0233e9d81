"""Tar shards and TFRecord files from local disk: the records of the reference readers
(webdataset's and the `tfrecord` package's iteration) byte for byte, decoded fields, resume in
the middle of a shard, corrupt records named by shard and offset, and the cached indexes."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_batches_equal, assert_equal_output_after_checkpoint
from PIL import Image
from shard_files import SAMPLES, sample_files, write_tar_shards, write_tfrecords
from tfrecord.reader import example_loader, tfrecord_iterator
from webdataset.tariterators import group_by_keys, tar_file_expander

from loadax import Batcher, DataLoader, RecordError
from loadax.execution.pipeline import Pipeline
from loadax.identity.fingerprint import pipeline_fingerprint
from loadax.sources.shards import IndexCache
from loadax.sources.tar import TarShardDataset
from loadax.sources.tfrecord import TFRecordDataset


@pytest.fixture
def tars(tmp_path: Path) -> list[Path]:
    return write_tar_shards(tmp_path, 3)


@pytest.fixture
def tfrecords(tmp_path: Path) -> list[Path]:
    return write_tfrecords(tmp_path, 3)


def webdataset_samples(paths: list[Path]) -> list[dict[str, Any]]:
    """The samples webdataset's `WebDataset(urls)` iterates (its tar expansion and grouping),
    each shard opened and closed here (webdataset's own opener leaves them to the collector)."""
    samples = []
    for path in paths:
        with path.open("rb") as stream:
            files = tar_file_expander([{"url": str(path), "stream": stream}])
            samples.extend(group_by_keys(files))
    return samples


def test_tar_samples_are_webdatasets_byte_for_byte(tars: list[Path], tmp_path: Path) -> None:
    urls = [str(path) for path in tars]
    reference = webdataset_samples(tars)
    samples = TarShardDataset(tmp_path / "*.tar", decode=False, index_dir=tmp_path / "indexes")
    assert samples.paths == tuple(urls)
    assert len(samples) == len(reference) == 3 * SAMPLES
    for got, want in zip(samples, reference, strict=True):
        assert got == want
    assert set(samples[0]) == {"__key__", "__url__", "png", "cls", "json", "npy", "seg.txt"}
    # In any order, in one batched read (neighbours in one request), as a copy would read.
    order = np.array([20, 0, 1, 13, 2, 7, 20])
    copy = pickle.loads(pickle.dumps(samples))
    assert copy.read(order, 0) == [samples[int(index)] for index in order]


def test_tar_fields_are_decoded_by_extension(tars: list[Path], tmp_path: Path) -> None:
    samples = TarShardDataset(tars, index_dir=tmp_path)
    for index in (0, 9, 20):
        files = dict(sample_files(index))
        key = f"part/{index:05d}"
        got = samples[index]
        expected_image = np.asarray(Image.open(io.BytesIO(files[f"{key}.png"])).convert("RGB"))
        np.testing.assert_array_equal(got["png"], expected_image)
        assert got["cls"] == index % 4
        assert got["json"] == {"n": index}
        np.testing.assert_array_equal(got["npy"], np.arange(index % 5 + 1, dtype=np.int16))
        assert got["seg.txt"] == "text\x00" * (index % 3)
    picked = TarShardDataset(tars, fields=["cls", "__key__"], index_dir=tmp_path)
    assert picked[9] == {"cls": 1, "__key__": "part/00009"}
    grey = TarShardDataset(tars, fields=["png"], image_mode="L", index_dir=tmp_path)
    assert grey[3]["png"].shape == (5, 6, 1)
    with pytest.raises(ValueError, match=r"fields must be None or a non-empty sequence"):
        TarShardDataset(tars, fields="png", index_dir=tmp_path)
    with pytest.raises(ValueError, match=r"has no field 'jpg'; its fields are \['cls', 'json'"):
        TarShardDataset(tars, fields=["jpg"], index_dir=tmp_path)[4]


def test_tfrecords_are_the_tfrecord_packages_byte_for_byte(
    tfrecords: list[Path], tmp_path: Path
) -> None:
    raw = TFRecordDataset(tmp_path / "*.tfrecord", parse=False, index_dir=tmp_path)
    assert list(raw) == [bytes(view) for path in tfrecords for view in tfrecord_iterator(str(path))]
    parsed = TFRecordDataset(tfrecords, index_dir=tmp_path)
    reference = [example for path in tfrecords for example in example_loader(str(path), None)]
    assert len(parsed) == len(reference) == 3 * SAMPLES
    for got, want in zip(parsed, reference, strict=True):
        assert list(got) == sorted(want)
        assert got["image"] == want["image"]  # one bytes value: bytes, as the package gives
        assert got["tags"] == [b"a\x00", b"b"]  # several: a list, trailing zeros kept
        for name in ("label", "vector"):
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("source", ["tar", "tfrecord"])
def test_a_loader_resumes_in_the_middle_of_a_shard(
    source: str, tars: list[Path], tfrecords: list[Path], tmp_path: Path
) -> None:
    dataset: Any = (
        TarShardDataset(tars, fields=["cls", "npy", "__key__"], index_dir=tmp_path)
        if source == "tar"
        else TFRecordDataset(tfrecords, index_dir=tmp_path).map(lambda r: r["label"])
    )
    builder = DataLoader(Batcher(list)).batch_size(3).shuffle(seed=5).num_epochs(2)
    # Batches of 3 over shards of 7: most steps start inside a shard.
    assert_equal_output_after_checkpoint(builder.workers(2).build(dataset))
    threads = list(builder.workers(2).build(dataset))
    assert_batches_equal(list(builder.workers(0).build(dataset)), threads)


def test_a_corrupt_tfrecord_names_its_file_and_offset(
    tfrecords: list[Path], tmp_path: Path
) -> None:
    data = bytearray(tfrecords[1].read_bytes())
    offsets = [0]
    for view in tfrecord_iterator(str(tfrecords[1])):
        offsets.append(offsets[-1] + 16 + len(view))
    data[offsets[3] + 20] ^= 0xFF  # inside record 3's data
    tfrecords[1].write_bytes(bytes(data))
    records = TFRecordDataset(tfrecords, index_dir=tmp_path)
    loader = DataLoader(Batcher(list)).batch_size(SAMPLES).build(records)
    with pytest.raises(RecordError) as raised:
        list(loader)
    assert raised.value.index == SAMPLES + 3
    assert str(raised.value.__cause__) == (
        f"TFRecordDataset: the record at offset {offsets[3]} of {str(tfrecords[1])!r} is "
        "corrupt: its data does not match its CRC"
    )
    data[offsets[5] + 9] ^= 0xFF  # record 5's length CRC: the index cannot be built
    tfrecords[1].write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"offset {offsets[5]} of .*train-001.* corrupt header"):
        TFRecordDataset(tfrecords, index_dir=tmp_path)


def test_a_corrupt_tar_member_names_its_shard_and_offset(tars: list[Path], tmp_path: Path) -> None:
    samples = TarShardDataset(tars, index_dir=tmp_path)
    offset = int(samples.indexes[2]["offsets"][5 * 5])  # sample 5's png in shard 2
    data = bytearray(tars[2].read_bytes())
    data[offset : offset + 8] = b"garbage!"
    tars[2].write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"shard-002.tar' at offset \d+: not an image"):
        TarShardDataset(tars, index_dir=tmp_path)[2 * SAMPLES + 5]
    tars[2].write_bytes(bytes(data[: offset + 10]))  # truncated inside that member
    with pytest.raises(ValueError, match=r"index .*shard-002.tar' after byte \d+: unexpected end"):
        TarShardDataset(tars, index_dir=tmp_path)


def test_indexes_are_cached_reused_and_rebuilt(
    tars: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    cache = tmp_path / "indexes"
    scanned: list[int] = []
    build = TarShardDataset.build_index

    def counted(self: TarShardDataset, shard: int, file: Any, size: int) -> Any:
        scanned.append(shard)
        return build(self, file=file, shard=shard, size=size)

    monkeypatch.setattr(TarShardDataset, "build_index", counted)
    first = TarShardDataset(tars, decode=False, index_dir=cache)
    assert scanned == [0, 1, 2]
    files = sorted(cache.iterdir())
    assert [file.name.endswith(".tar.npz") for file in files] == [True] * 3
    expected = list(first)
    assert list(TarShardDataset(tars, decode=False, index_dir=cache)) == expected
    assert scanned == [0, 1, 2]  # loaded, not scanned again
    # A shard rewritten (another size and time): its index alone is built again.
    with open(tars[1], "ab") as shard:
        shard.write(bytes(1024))
    os.utime(tars[1], ns=(1, 1))
    assert list(TarShardDataset(tars, decode=False, index_dir=cache)) == expected
    assert scanned == [0, 1, 2, 1]
    # A damaged index file (a crash mid-write cannot leave one: files are renamed into place).
    path = IndexCache(cache, "tar", "TarShardDataset").path(str(tars[2]))
    path.write_bytes(path.read_bytes()[:-40])
    with caplog.at_level(logging.WARNING, logger="loadax.sources.shards"):
        assert list(TarShardDataset(tars, decode=False, index_dir=cache)) == expected
    assert scanned == [0, 1, 2, 1, 2]
    assert "does not load" in caplog.text
    assert not list(cache.glob("*.partial"))
    assert list(TarShardDataset(tars, decode=False, index_dir=cache)) == expected
    assert scanned == [0, 1, 2, 1, 2]


def test_copies_and_processes_read_the_same_records_with_the_same_fingerprint(
    tfrecords: list[Path], tmp_path: Path
) -> None:
    records = TFRecordDataset(tfrecords, parse=False, index_dir=tmp_path)
    copy = pickle.loads(pickle.dumps(records))
    assert pipeline_fingerprint(Pipeline(copy, Batcher(list))) == pipeline_fingerprint(
        Pipeline(records, Batcher(list))
    )
    builder = DataLoader(Batcher(list)).batch_size(4).shuffle(seed=1)
    expected = list(builder.workers(2).build(records))
    assert_batches_equal(builder.workers(2, kind="processes").build(records), expected)


def test_bad_arguments_are_named(tars: list[Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"TarShardDataset: no file matches"):
        TarShardDataset(tmp_path / "*.tgz", index_dir=tmp_path)
    with pytest.raises(IsADirectoryError, match=r"is a directory; name its shards"):
        TarShardDataset(tmp_path, index_dir=tmp_path)
    with pytest.raises(ValueError, match=r"image_mode must be one of"):
        TarShardDataset(tars, image_mode="CMYK", index_dir=tmp_path)
    with pytest.raises(ValueError, match=r"TFRecordDataset: paths must not be empty"):
        TFRecordDataset([], index_dir=tmp_path)
    (tmp_path / "notes.json").write_text(json.dumps({"not": "a tfrecord"}) * 4)
    with pytest.raises(ValueError, match=r"offset 0 of .*notes.json' has a corrupt header"):
        TFRecordDataset(tmp_path / "notes.json", index_dir=tmp_path)
    compressed = tmp_path / "shard.tar.gz"
    import tarfile

    with tarfile.open(compressed, "w:gz") as archive:
        archive.add(tars[0], "inner.tar")
    with pytest.raises(ValueError, match=r"shard.tar.gz': it is gzip-compressed"):
        TarShardDataset(compressed, index_dir=tmp_path)
