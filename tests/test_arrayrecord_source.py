"""Tests for loadax/arrayrecord_source.py: records of ArrayRecord files, locally and remotely."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import record_pipelines
from array_record.python.array_record_module import ArrayRecordWriter
from equivalence import BATCH, digests, digests_in_every_mode, loader
from helpers import assert_batches_equal

from loadax import InMemoryDataset
from loadax.sources.arrayrecord import ArrayRecordDataset


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """record_pipelines imports `datasets`: keep it, and the worker processes, off the network."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def written(path: Path, records: list[bytes], options: str = "group_size:1") -> Path:
    writer = ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()
    return path


def payload(index: int) -> bytes:
    return f"record {index}:".encode() + bytes([index % 256]) * (index % 5)


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    """Three files holding records 0-6, none, and 7-19, as `payload(i)`."""
    return [
        written(tmp_path / "a.arrayrecord", [payload(i) for i in range(7)]),
        written(tmp_path / "empty.arrayrecord", []),
        written(tmp_path / "b.arrayrecord", [payload(i) for i in range(7, 20)], "group_size:4"),
    ]


def test_records_are_the_files_in_order(files: list[Path]) -> None:
    dataset = ArrayRecordDataset(files)
    assert len(dataset) == 20
    assert list(dataset) == [payload(i) for i in range(20)]
    assert dataset[-1] == payload(19)
    assert dataset[-20] == payload(0)
    assert dataset.paths == tuple(files)


def test_a_single_path_is_one_file(files: list[Path]) -> None:
    dataset = ArrayRecordDataset(str(files[0]))
    assert list(dataset) == [payload(i) for i in range(7)]


def test_getitems_equals_per_index_reads(files: list[Path]) -> None:
    dataset = ArrayRecordDataset(files)
    indices = [19, 0, 6, 7, 7, -2, 3, 12]
    batched = dataset.__getitems__(indices)
    assert batched == [dataset[index] for index in indices]
    assert batched == [payload(index % 20) for index in indices]
    assert dataset.__getitems__([]) == []


def test_decode_is_applied_to_every_record(files: list[Path]) -> None:
    dataset = ArrayRecordDataset(files, decode=lambda record: record.split(b":")[0].decode())
    assert dataset.__getitems__([8, 1]) == ["record 8", "record 1"]


def test_out_of_range_indices_raise_index_error(files: list[Path]) -> None:
    dataset = ArrayRecordDataset(files)
    for index in (20, -21):
        with pytest.raises(IndexError, match=f"index {index} is out of range for ArrayRecord"):
            dataset[index]


def test_concurrent_reader_threads_get_the_right_records(files: list[Path]) -> None:
    dataset = ArrayRecordDataset(files)

    def read(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(50):
            indices = [rng.randrange(-20, 20) for _ in range(rng.randrange(1, 12))]
            assert dataset.__getitems__(indices) == [payload(index % 20) for index in indices]

    with ThreadPoolExecutor(8) as pool:
        for outcome in [pool.submit(read, seed) for seed in range(16)]:
            outcome.result()
    assert len(dataset._readers) > 1  # each reading thread opened its own readers
    dataset.close()
    assert dataset[3] == payload(3)  # a read after close opens new readers
    dataset.close()


def test_a_missing_file_raises_file_not_found_naming_it(files: list[Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no ArrayRecord file at .*absent\.arrayrecord"):
        ArrayRecordDataset([files[0], tmp_path / "absent.arrayrecord"])
    assert not (tmp_path / "absent.arrayrecord").exists()


@pytest.mark.parametrize("size", [100, 200_000])
def test_a_file_that_is_not_array_record_raises_value_error_naming_it(
    tmp_path: Path, size: int
) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"x" * size)
    with pytest.raises(ValueError, match=r"notes\.txt' is not an ArrayRecord file: \w"):
        ArrayRecordDataset(path)


def test_bad_arguments_raise_value_error_naming_them(files: list[Path]) -> None:
    with pytest.raises(ValueError, match="paths must not be empty"):
        ArrayRecordDataset([])
    with pytest.raises(ValueError, match="decode must be callable"):
        ArrayRecordDataset(files, decode="utf-8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'s3://bucket/a\.array_record' is a URL, but Array"):
        ArrayRecordDataset([files[0], "s3://bucket/a.array_record"])


def in_memory_rows(records: int) -> InMemoryDataset[dict[str, Any]]:
    x, labels = record_pipelines.row_values(records)
    return InMemoryDataset([{"x": x[i], "label": labels[i]} for i in range(records)])


def test_a_threaded_loader_gives_the_in_memory_batches(tmp_path: Path) -> None:
    paths = record_pipelines.write_arrayrecord_rows(tmp_path, records=45, files=3)
    expected = list(loader(in_memory_rows(45)))
    assert len(expected) == 2 * 6
    dataset = ArrayRecordDataset(paths, decode=record_pipelines.decode_row)
    assert_batches_equal(loader(dataset), expected)


def test_in_process_and_remote_workers_give_the_local_batches(tmp_path: Path) -> None:
    reference = digests_in_every_mode(tmp_path, "record_pipelines", "arrayrecord_rows")
    assert len(reference) == 2 * 5
    assert reference == digests(loader(in_memory_rows(40)))
    first = next(iter(loader(record_pipelines.arrayrecord_rows(str(tmp_path / "data")).dataset)))
    assert first["x"].shape == (BATCH, record_pipelines.WIDTH)
