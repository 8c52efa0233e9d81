"""`cache()` keeps a deterministic prefix's records across epochs, keyed by its identity: epochs
after the first skip the prefix, batches stay byte-identical, a changed prefix never reads an
old cache, a damaged file is computed again, and it works on a worker and in an object store."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import process_pipelines
import pytest
from equivalence import digests
from moto_server import BUCKET, Moto

import loadax
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker

RECORDS = 12


class Decoder:
    """An expensive decode, counting the records it decoded; `scale` changes what it does."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale
        self.decoded = 0
        self._lock = threading.Lock()

    def __call__(self, index: int) -> dict[str, Any]:
        with self._lock:
            self.decoded += 1
        return {"x": np.full(8, index * self.scale, dtype=np.int32), "name": f"r{index}"}


def batches(dataset: loadax.Dataset[Any], epochs: int = 3) -> list[str]:
    loader = loadax.DataLoader(loadax.Batcher()).batch_size(4).shuffle(seed=3)
    return digests(loader.num_epochs(epochs).build(dataset))


def test_epochs_after_the_first_skip_the_prefix_and_batches_are_unchanged() -> None:
    decoder = Decoder()
    cached = loadax.RangeDataset(0, RECORDS).map(decoder).cache()
    assert batches(cached) == batches(loadax.RangeDataset(0, RECORDS).map(Decoder()))
    assert decoder.decoded == RECORDS + 1  # each record once, and the first for the identity
    stats = cached.stats()
    assert (stats.misses, stats.hits) == (RECORDS, 2 * RECORDS)
    assert stats.size_bytes > 0
    assert stats.bytes_saved == 2 * stats.size_bytes
    loader = loadax.DataLoader(loadax.Batcher()).batch_size(4).build(cached.map(dict))
    assert loader.stats().reuse == stats  # a loader's stats() add up its cache() ops


def test_a_cache_after_a_random_map_is_refused() -> None:
    noisy = loadax.RangeDataset(0, 4).random_map(lambda x, rng: x + rng.random(), seed=1)
    with pytest.raises(ValueError, match=r"random_map\(<lambda>, seed=1\) reads other records"):
        noisy.cache()


def test_records_past_max_bytes_are_computed_each_time() -> None:
    decoder = Decoder()
    cached = loadax.RangeDataset(0, RECORDS).map(decoder).cache(max_bytes=400)
    assert batches(cached, epochs=2) == batches(loadax.RangeDataset(0, RECORDS).map(Decoder()), 2)
    assert 0 < cached.stats().size_bytes <= 400
    assert RECORDS + 1 < decoder.decoded < 2 * RECORDS + 1


def test_files_serve_another_process_and_a_changed_prefix_never_reads_them(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}"
    first = loadax.RangeDataset(0, RECORDS).map(Decoder()).cache(url)
    expected = batches(first, epochs=1)
    decoder = Decoder()  # a new process's pipeline: the same code, a cache of its own
    assert batches(loadax.RangeDataset(0, RECORDS).map(decoder).cache(url), 1) == expected
    assert decoder.decoded == 1  # the identity's probe
    changed = Decoder(scale=2)
    got = batches(loadax.RangeDataset(0, RECORDS).map(changed).cache(url), epochs=1)
    assert got == batches(loadax.RangeDataset(0, RECORDS).map(Decoder(scale=2)), epochs=1)
    assert changed.decoded == RECORDS + 1
    assert len({path.parent.parent for path in tmp_path.rglob("*.rec")}) == 2  # two identities


def test_a_truncated_or_damaged_file_is_computed_again(tmp_path: Path) -> None:
    list(loadax.RangeDataset(0, RECORDS).map(Decoder()).cache(tmp_path))
    files = sorted(tmp_path.rglob("*.rec"))
    files[3].write_bytes(files[3].read_bytes()[:-5])  # a partial write
    damaged = bytearray(files[5].read_bytes())
    damaged[-1] ^= 0xFF
    files[5].write_bytes(bytes(damaged))
    decoder = Decoder()
    again = loadax.RangeDataset(0, RECORDS).map(decoder).cache(tmp_path)
    assert [record["x"][0] for record in again] == list(range(RECORDS))
    assert decoder.decoded == 1 + 2  # the probe, and the two files that were not whole
    assert again.stats().misses == 2


def test_loader_processes_share_the_files_and_give_the_same_batches(tmp_path: Path) -> None:
    builder = loadax.DataLoader(loadax.Batcher()).batch_size(4).shuffle(seed=3).num_epochs(2)
    cached = loadax.RangeDataset(0, RECORDS).map(process_pipelines.record).cache(tmp_path)
    loader = builder.workers(2, kind="processes").build(cached)
    try:
        got = digests(loader)
    finally:
        loader.close()
    assert got == digests(
        builder.build(loadax.RangeDataset(0, RECORDS).map(process_pipelines.record))
    )
    assert len(list(tmp_path.rglob("*.rec"))) == RECORDS  # every record, written by a process


def test_a_worker_s_cache_serves_every_epoch_of_its_clients() -> None:
    decoder = Decoder()
    pipeline = loadax.Pipeline(
        loadax.RangeDataset(0, RECORDS).map(decoder).cache(), loadax.Batcher()
    )
    worker = Worker({"cached": pipeline}, threads=2)
    try:
        decoded = decoder.decoded  # the start-up probes
        loader = RemoteDataLoader([worker], pipeline="cached").batch_size(4).shuffle(seed=3)
        with loader.num_epochs(3).build() as built:
            got = digests(built)
    finally:
        worker.close()
    assert got == batches(loadax.RangeDataset(0, RECORDS).map(Decoder()))
    assert decoder.decoded - decoded <= RECORDS


@pytest.fixture
def moto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "moto").mkdir()
    server = Moto(tmp_path / "moto")
    server.environment(monkeypatch)
    try:
        yield server
    finally:
        server.close()


def test_an_object_store_cache_is_written_whole_and_read_back(moto: Moto) -> None:
    url = f"s3://{BUCKET}/cache?scheme=http"
    expected = batches(loadax.RangeDataset(0, RECORDS).map(Decoder()), epochs=1)
    assert batches(loadax.RangeDataset(0, RECORDS).map(Decoder()).cache(url), 1) == expected
    decoder = Decoder()
    again = loadax.RangeDataset(0, RECORDS).map(decoder).cache(url)
    assert batches(again, epochs=1) == expected
    assert (decoder.decoded, again.stats().hits) == (1, RECORDS)
