"""Tar shards and TFRecord files in a bucket (moto's S3 server on loopback): the records of the
same files read locally, by ranged reads once indexed, in threads, processes and a worker."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pytest
from helpers import assert_batches_equal
from moto_server import BUCKET, Moto
from shard_files import SAMPLES, add, write_tar_shards, write_tfrecords
from test_object_store import CountingHandler

from loadax import Batcher, DataLoader, Pipeline
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker
from loadax.sources.tar import TarShardDataset
from loadax.sources.tfrecord import TFRecordDataset


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, moto: Moto) -> Path:
    """Two tar shards and two TFRecord files, locally and under s3://bucket/shards/."""
    directory = tmp_path_factory.mktemp("shards")
    for path in [*write_tar_shards(directory, 2), *write_tfrecords(directory, 2)]:
        key = f"{BUCKET}/shards/{path.name}"
        pafs.copy_files(str(path), key, destination_filesystem=moto.filesystem())
    return directory


def without_url(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in sample.items() if key != "__url__"} for sample in samples]


def test_shards_in_a_bucket_are_the_local_shards(
    moto: Moto, local: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto.environment(monkeypatch)
    samples = TarShardDataset(f"s3://{BUCKET}/shards/*.tar", decode=False, index_dir=tmp_path)
    assert samples.paths == tuple(f"s3://{BUCKET}/shards/shard-00{n}.tar" for n in range(2))
    assert samples[SAMPLES]["__url__"] == f"s3://{BUCKET}/shards/shard-001.tar"
    expected = list(TarShardDataset(local / "*.tar", decode=False, index_dir=tmp_path))
    assert without_url(list(samples)) == without_url(expected)
    records = TFRecordDataset(
        f"{BUCKET}/shards/*.tfrecord", parse=False, filesystem=moto.filesystem(), index_dir=tmp_path
    )
    assert list(records) == list(TFRecordDataset(local / "*.tfrecord", parse=False))
    with pytest.raises(FileNotFoundError, match=r"TFRecordDataset: no object matches"):
        TFRecordDataset(f"s3://{BUCKET}/shards/*.tfrec", index_dir=tmp_path)


def test_an_indexed_record_is_one_ranged_read(moto: Moto, local: Path, tmp_path: Path) -> None:
    url = f"{BUCKET}/shards/train-001.tfrecord"
    TFRecordDataset(url, filesystem=moto.filesystem(), index_dir=tmp_path)  # indexes it
    counting = pafs.PyFileSystem(CountingHandler(moto.filesystem()))
    records = TFRecordDataset(url, filesystem=counting, index_dir=tmp_path)
    CountingHandler.reads.clear()
    records.read(np.array([4]), 0)
    index = records.indexes[0]
    assert CountingHandler.reads == [int(index["lengths"][4]) + 16]


def test_a_batch_fetches_its_requests_together_until_closed(
    moto: Moto, local: Path, tmp_path: Path
) -> None:
    def fetchers() -> set[threading.Thread]:  # of this dataset: an earlier one's may linger
        named = {t for t in threading.enumerate() if t.name.startswith("TFRecordDataset-fetch")}
        return named - earlier

    earlier: set[threading.Thread] = set()
    earlier = fetchers()
    url = f"{BUCKET}/shards/*.tfrecord"
    records = TFRecordDataset(url, parse=False, filesystem=moto.filesystem(), index_dir=tmp_path)
    expected = list(TFRecordDataset(local / "*.tfrecord", parse=False, index_dir=tmp_path))
    order = np.random.default_rng(0).permutation(len(expected))
    assert records.read(order, 0) == [expected[index] for index in order.tolist()]
    assert fetchers()
    records.close()
    assert not fetchers()
    assert records.read(order[:2], 0) == [expected[index] for index in order[:2].tolist()]
    records.close()


def test_loaders_read_the_bucket_in_threads_processes_and_a_worker(
    moto: Moto, local: Path, tmp_path: Path
) -> None:
    def loaded(dataset: Any, kind: str = "threads") -> list[Any]:
        builder = DataLoader(Batcher(list)).batch_size(3).shuffle(seed=2).num_epochs(2)
        return list(builder.workers(2, kind=kind).build(dataset))

    options = {"fields": ["cls", "png"], "index_dir": tmp_path}
    expected = loaded(TarShardDataset(local / "*.tar", **options))
    samples = TarShardDataset(f"{BUCKET}/shards/*.tar", filesystem=moto.filesystem(), **options)
    assert_batches_equal(loaded(samples), expected)
    # A process unpickles it by its URLs and the filesystem's options, and loads the index.
    assert_batches_equal(loaded(samples, kind="processes"), expected)
    worker = Worker({"samples": Pipeline(samples, Batcher(list))}, threads=2)
    try:
        remote = RemoteDataLoader([worker], pipeline="samples").batch_size(3).shuffle(seed=2)
        with remote.num_epochs(2).build() as batches:
            assert_batches_equal(batches, expected)
    finally:
        worker.close()


def test_shards_read_in_order_are_read_ahead_and_others_by_record(
    moto: Moto, local: Path, tmp_path: Path
) -> None:
    url, options = f"{BUCKET}/shards/*.tar", {"decode": False, "index_dir": tmp_path}
    expected = list(TarShardDataset(local / "*.tar", **options))
    TarShardDataset(url, filesystem=moto.filesystem(), **options)  # indexes them
    counting = pafs.PyFileSystem(CountingHandler(moto.filesystem()))
    in_order = TarShardDataset(url, filesystem=counting, **options)
    CountingHandler.reads.clear()
    assert without_url([in_order[number] for number in range(len(in_order))]) == without_url(
        expected
    )
    in_order.close()  # waits for what was read ahead
    # Three requests start a run; then blocks of samples ahead, on into shard 1 (one a sample
    # without read-ahead; the blocks' sizes are tests/test_readahead.py's).
    assert len(CountingHandler.reads) < len(expected)
    assert sum(CountingHandler.reads) <= sum(in_order.shards.sizes)  # no byte twice
    shuffled = TarShardDataset(url, filesystem=counting, **options)
    CountingHandler.reads.clear()
    order = list(reversed(range(len(expected))))  # no request starts where one ended
    assert without_url([shuffled[number] for number in order]) == without_url(
        [expected[number] for number in order]
    )
    shuffled.close()
    spans = [(ends - starts).tolist() for starts, ends in shuffled._spans]
    assert sorted(CountingHandler.reads) == sorted(spans[0] + spans[1])  # each sample's bytes
    loader = DataLoader(Batcher(list)).batch_size(3).workers(2)
    batches = [without_url(batch) for batch in loader.build(in_order)]
    assert batches == [without_url(batch) for batch in loader.build(expected)]


def test_samples_within_a_mebibyte_in_a_bucket_are_one_request(moto: Moto, tmp_path: Path) -> None:
    path = tmp_path / "spread.tar"
    with tarfile.open(path, "w") as archive:
        for key, size in (("a", 10), ("b", 300_000), ("c", 10), ("d", 2_000_000), ("e", 10)):
            add(archive, f"{key}.bin", bytes([len(key)]) * size)
    pafs.copy_files(
        str(path), f"{BUCKET}/spread/{path.name}", destination_filesystem=moto.filesystem()
    )
    counting = pafs.PyFileSystem(CountingHandler(moto.filesystem()))
    samples = TarShardDataset(f"{BUCKET}/spread/*.tar", filesystem=counting, index_dir=tmp_path)
    CountingHandler.reads.clear()
    assert [sample["__key__"] for sample in samples.read(np.array([0, 2, 4]), 0)] == ["a", "c", "e"]
    # a and c are 300 kB apart: one request through b; e lies 2 MB further: one of its own.
    starts, ends = samples._spans[0]
    assert sorted(CountingHandler.reads) == [10, ends[2] - starts[0]]


def test_a_block_shuffle_fetches_each_window_of_a_bucket_once_in_large_requests(
    moto: Moto, local: Path, tmp_path: Path
) -> None:
    url, options = f"{BUCKET}/shards/*.tar", {"decode": False, "index_dir": tmp_path}
    TarShardDataset(url, filesystem=moto.filesystem(), **options)  # indexes them
    counting = pafs.PyFileSystem(CountingHandler(moto.filesystem()))
    samples = TarShardDataset(url, filesystem=counting, **options)
    # Each shard a block, each block a window: the first step expects both windows.
    builder = DataLoader(Batcher(list)).batch_size(3).shuffle(seed=2, block_size=SAMPLES, window=1)
    loader = builder.workers(2).build(samples)
    CountingHandler.reads.clear()  # of the loader's probe of a record when it was built
    batches = [without_url(batch) for batch in loader]
    samples.close()
    expected = builder.build(TarShardDataset(local / "*.tar", **options))
    assert batches == [without_url(batch) for batch in expected]
    spans = [int(ends.max() - starts.min()) for starts, ends in samples._spans]
    assert sorted(CountingHandler.reads) == sorted(spans)  # one request a shard, not a sample
