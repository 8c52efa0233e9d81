"""A local loader's `stats()` (the remote one's fields), and readable reprs of every dataset, op,
source, stream, batcher, builder, loader and iterator."""

from __future__ import annotations

import dataclasses
import doctest
import functools
import importlib
import inspect
import pathlib
import pkgutil
import sqlite3
import time
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import loadax.dataset
import loadax.sources
from loadax import (
    Batcher,
    ConcatenatedDataset,
    DataLoader,
    DatasetBase,
    InMemoryDataset,
    MappedDataset,
    MixedDataset,
    NumpyDataset,
    Pipeline,
    RandomMappedDataset,
    RangeDataset,
    RecordError,
    RepeatedDataset,
    ShuffledDataset,
    SlicedDataset,
    SQLiteDataset,
    Stream,
    pad_batcher,
)
from loadax.client import LoaderStats as RemoteLoaderStats
from loadax.client import RemoteDataLoader
from loadax.iterators.stats import LoaderStats
from loadax.server.worker import Worker


def decode(record: Any) -> Any:
    return record


def jitter(record: Any, rng: np.random.Generator) -> Any:
    return record


def keep(record: Any) -> bool:
    return True


# ---------------------------------------------------------------------------------------- stats


def test_local_stats_have_the_remote_fields() -> None:
    fields = [field.name for field in dataclasses.fields(LoaderStats)]
    assert fields == [field.name for field in dataclasses.fields(RemoteLoaderStats)]
    stats = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4)).stats()
    assert stats == LoaderStats(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, {}, {})


def test_stats_count_every_iterator_of_the_loader() -> None:
    records = RangeDataset(0, 10).map(lambda i: {"x": np.full(3, i, np.float32), "y": i})
    loader = DataLoader(Batcher()).batch_size(4).shuffle(seed=0).workers(2).build(records)
    list(loader.epoch(0))
    list(loader.epoch(1))
    iterator = iter(loader)
    next(iterator)
    stats = loader.stats()
    # 3 + 3 + 1 batches; a record is 3 float32 and an int64.
    assert (stats.batches, stats.bytes) == (7, (10 + 10 + 4) * (3 * 4 + 8))
    assert stats.seconds > 0
    assert stats.batches_per_second == pytest.approx(7 / stats.seconds)
    assert stats.bytes_per_second == pytest.approx(stats.bytes / stats.seconds)
    assert (stats.workers, stats.left_out) == ({}, {})
    other = DataLoader(Batcher()).batch_size(4).build(records)
    assert other.stats().batches == 0  # each loader counts its own


def slow(record: int) -> int:
    time.sleep(0.01)
    return record


def test_the_wait_fraction_is_high_when_loading_is_the_bottleneck() -> None:
    loader = DataLoader(Batcher()).batch_size(2).workers(0).build(RangeDataset(0, 12).map(slow))
    list(loader)
    stats = loader.stats()
    assert stats.waited_seconds >= 0.12
    assert stats.wait_fraction > 0.8, stats


def test_the_wait_fraction_is_low_when_the_loop_is_the_bottleneck() -> None:
    loader = DataLoader(Batcher()).batch_size(2).prefetch(2).build(RangeDataset(0, 12))
    for _ in loader:
        time.sleep(0.02)  # the training step
    stats = loader.stats()
    assert stats.batches == 6
    assert stats.wait_fraction < 0.3, stats


def test_a_stream_counts_the_batches_it_yields() -> None:
    stream = RangeDataset(0, 10).filter(lambda x: x % 2 == 1)
    loader = DataLoader(Batcher()).batch_size(2).build(stream)
    batches = list(loader)
    stats = loader.stats()
    assert (stats.batches, stats.bytes) == (len(batches), 5 * 8)


def test_a_failed_next_counts_its_wait_but_no_batch() -> None:
    def fail_on_3(record: int) -> int:
        if record == 3:
            time.sleep(0.05)
            raise ValueError("bad record")
        return record

    loader = DataLoader(Batcher()).batch_size(2).workers(0).build(RangeDataset(0, 6).map(fail_on_3))
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(RecordError):
        next(iterator)
    stats = loader.stats()
    assert (stats.batches, stats.bytes) == (1, 16)
    assert stats.waited_seconds >= 0.05


def test_device_prefetch_counts_each_batch_once() -> None:
    loader = DataLoader(Batcher()).batch_size(2).device_prefetch(2).build(RangeDataset(0, 10))
    assert len(list(loader)) == 5
    assert (loader.stats().batches, loader.stats().bytes) == (5, 80)


# ---------------------------------------------------------------------------------------- reprs


@pytest.mark.parametrize(
    ("dataset", "shown"),
    [
        (RangeDataset(0, 10), "RangeDataset(0, 10)"),
        (RangeDataset(10, 0, -2), "RangeDataset(10, 0, -2)"),
        (
            RangeDataset(0, 10).shuffle(seed=0).map(decode),
            "RangeDataset(0, 10).shuffle(seed=0).map(decode)",
        ),
        (RangeDataset(0, 4).shuffle(), "RangeDataset(0, 4).shuffle(seed=0)"),
        (
            RangeDataset(0, 4).random_map(jitter, seed=3),
            "RangeDataset(0, 4).random_map(jitter, seed=3)",
        ),
        (RangeDataset(0, 4).map(lambda x: x), "RangeDataset(0, 4).map(<lambda>)"),
        (
            RangeDataset(0, 4).map(functools.partial(divmod, 7)),
            "RangeDataset(0, 4).map(partial(divmod, 7))",
        ),
        (RangeDataset(0, 4).map(str.upper), "RangeDataset(0, 4).map(str.upper)"),
        (RangeDataset(0, 100).slice(-10, None, 2), "RangeDataset(0, 100).slice(90, 100, 2)"),
        (RangeDataset(0, 10).slice(None, None, -3), "RangeDataset(0, 10).slice(9, None, -3)"),
        (RangeDataset(0, 10).slice(2, 4), "RangeDataset(0, 10).slice(2, 4)"),
        (
            RangeDataset(0, 2).concatenate([5, 6], RangeDataset(3, 4)),
            "RangeDataset(0, 2).concatenate([5, 6], RangeDataset(3, 4))",
        ),
        (RangeDataset(0, 3).repeat(4), "RangeDataset(0, 3).repeat(4)"),
        (InMemoryDataset(list(range(100))), "InMemoryDataset([0, 1, 2, 3, 4, 5, ...])"),
        (InMemoryDataset(np.zeros((5, 2), np.uint8)), "InMemoryDataset(<ndarray (5, 2) uint8>)"),
        (MappedDataset([1, 2], decode), "MappedDataset([1, 2], decode)"),
        (RandomMappedDataset([1, 2], jitter, 1), "RandomMappedDataset([1, 2], jitter, seed=1)"),
        (ShuffledDataset(np.arange(3)), "ShuffledDataset(<ndarray (3,) int64>, seed=0)"),
        (SlicedDataset(range(10), 1, 8, 3), "SlicedDataset(range(0, 10), 1, 8, 3)"),
        (
            ConcatenatedDataset([[1], RangeDataset(0, 2)]),
            "ConcatenatedDataset([[1], RangeDataset(0, 2)])",
        ),
        (RepeatedDataset(["a"], 2), "RepeatedDataset(['a'], 2)"),
        (
            MixedDataset([RangeDataset(0, 70), [0] * 30], [0.7, 0.3], seed=2),
            "MixedDataset([RangeDataset(0, 70), [0, 0, 0, 0, 0, 0, ...]], weights=[7, 3], seed=2, "
            "window=10)",
        ),
    ],
)
def test_datasets_show_how_they_were_written(dataset: Any, shown: str) -> None:
    assert repr(dataset) == shown


def test_an_equivalent_dataset_is_built_from_a_repr() -> None:
    written = RangeDataset(0, 50).shuffle(seed=3).slice(-20, None, 3).repeat(2)
    names = {"RangeDataset": RangeDataset, "MixedDataset": MixedDataset}
    rebuilt = eval(repr(written), names)  # our own repr, in a test
    assert list(rebuilt) == list(written)
    mixed = MixedDataset([RangeDataset(0, 30), RangeDataset(100, 140)], [0.45, 0.55], seed=4)
    assert list(eval(repr(mixed), names)) == list(mixed)


@pytest.mark.parametrize(
    ("stream", "shown"),
    [
        (RangeDataset(0, 9).filter(keep), "RangeDataset(0, 9).filter(keep)"),
        (
            RangeDataset(0, 9).map(decode).filter(keep).map(decode).pack(8),
            "RangeDataset(0, 9).map(decode).filter(keep).map(decode).pack(8)",
        ),
        (
            RangeDataset(0, 9).pack(4, pad_value=-1, truncate=True),
            "RangeDataset(0, 9).pack(4, pad_value=-1, truncate=True)",
        ),
        (
            Stream(RangeDataset(0, 9), window=64).filter(keep),
            "Stream(RangeDataset(0, 9), window=64).filter(keep)",
        ),
        (Stream(RangeDataset(0, 9)).map(decode), "Stream(RangeDataset(0, 9)).map(decode)"),
        (Stream([1, 2, 3]).filter(keep), "Stream([1, 2, 3]).filter(keep)"),
        (Stream(RangeDataset(0, 9)), "Stream(RangeDataset(0, 9))"),
    ],
)
def test_streams_show_their_ops(stream: Stream[Any], shown: str) -> None:
    assert repr(stream) == shown


def test_sources_show_where_they_read(tmp_path: pathlib.Path) -> None:
    np.save(tmp_path / "rows.npy", np.zeros((3, 2)))
    path = str(tmp_path / "rows.npy")
    assert repr(NumpyDataset(path)) == f"NumpyDataset({path!r})"
    assert repr(NumpyDataset(path, mmap=False).map(decode)) == (
        f"NumpyDataset({path!r}, mmap=False).map(decode)"
    )
    database = tmp_path / "rows.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE t (id INTEGER, name TEXT)")
    connection.close()
    table = SQLiteDataset(database, table="t", columns=["name"])
    assert repr(table) == f"SQLiteDataset({str(database)!r}, table='t', columns=['name'])"
    table.close()


def test_optional_sources_show_where_they_read(tmp_path: pathlib.Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pl = pytest.importorskip("polars")
    datasets = pytest.importorskip("datasets")
    writer_module = pytest.importorskip("array_record.python.array_record_module")
    from loadax.sources.arrayrecord import ArrayRecordDataset
    from loadax.sources.huggingface import HuggingFaceDataset
    from loadax.sources.parquet import ParquetDataset
    from loadax.sources.polars import PolarsDataset

    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": [1, 2], "name": ["a", "b"]}), parquet)
    dataset = ParquetDataset(parquet, columns=["id"])
    assert repr(dataset.shuffle(seed=1)) == (
        f"ParquetDataset([{str(parquet)!r}], columns=['id']).shuffle(seed=1)"
    )
    dataset.close()
    frame = pl.DataFrame({"x": [1, 2, 3]})
    assert repr(PolarsDataset(frame)) == "PolarsDataset(<3 rows>, columns=['x'])"
    table = datasets.Dataset.from_dict({"text": ["a", "b"]})
    assert repr(HuggingFaceDataset(table, format="python")) == (
        "HuggingFaceDataset(<2 rows>, columns=['text'], format='python')"
    )
    records = tmp_path / "r.array_record"
    writer = writer_module.ArrayRecordWriter(str(records), "group_size:1")
    writer.write(b"a")
    writer.close()
    raw, decoded = ArrayRecordDataset(records), ArrayRecordDataset(records, decode=len)
    assert repr(raw) == f"ArrayRecordDataset([{str(records)!r}])"
    assert repr(decoded) == f"ArrayRecordDataset([{str(records)!r}], decode=len)"
    raw.close()
    decoded.close()


def dataset_classes() -> list[type]:
    """Every dataset class that loadax.dataset and loadax.sources define."""
    found = []
    for package in (loadax.dataset, loadax.sources):
        for module_info in pkgutil.iter_modules(package.__path__):
            try:
                module = importlib.import_module(f"{package.__name__}.{module_info.name}")
            except ImportError:  # an optional extra that is not installed
                continue
            for _, value in inspect.getmembers(module, inspect.isclass):
                if value.__module__ == module.__name__ and (
                    issubclass(value, DatasetBase) or value is Stream
                ):
                    found.append(value)
    return found


def test_every_dataset_class_writes_its_own_repr() -> None:
    classes = dataset_classes()
    assert {RangeDataset, MixedDataset, Stream, SQLiteDataset} <= set(classes)
    without = [
        cls.__qualname__
        for cls in classes
        if not writes_its_repr(cls) and not inspect.isabstract(cls)  # bases are not built
    ]
    assert not without, f"dataset classes without a __repr__ of their own: {without}"


def writes_its_repr(cls: type) -> bool:
    """Whether `cls`, or the records it is made of (a base that is not a dataset class, as
    `loadax.dataset.structure`'s are), defines `__repr__`: not a dataset class it extends."""
    own = [base for base in cls.__bases__ if not issubclass(base, DatasetBase)]
    return any("__repr__" in vars(owner) for owner in (cls, *own))


def test_a_dataset_of_unknown_class_shows_its_class_and_length() -> None:
    class Squares(DatasetBase[int]):
        def __len__(self) -> int:
            return 5

        def read(self, indices: Any, epoch: int) -> list[int]:
            return [i * i for i in indices.tolist()]

    assert repr(Squares().map(str)) == "Squares(<5 records>).map(str)"

    class Opaque:
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> int:
            return index

    assert repr(MappedDataset(Opaque(), decode)) == "MappedDataset(<Opaque of 2 records>, decode)"


class Normalize:
    def __call__(self, record: Any) -> Any:
        return record


def test_batchers_show_their_function() -> None:
    assert repr(Batcher()) == "Batcher()"
    assert repr(Batcher(sorted)) == "Batcher(sorted)"
    assert repr(Batcher(lambda xs: xs)) == "Batcher(<lambda>)"
    assert repr(Batcher(Normalize())) == "Batcher(<Normalize object>)"
    assert repr(pad_batcher(-1, length=4, keys=["x"])) == (
        "Batcher(PaddedStack(pad_value=-1, length=4, keys=('x',)))"
    )


def test_builders_and_loaders_show_their_settings() -> None:
    builder = DataLoader(Batcher()).batch_size(32).workers(4)
    assert repr(builder) == "DataLoader(Batcher()).batch_size(32).workers(4)"
    assert repr(DataLoader(Batcher())) == "DataLoader(Batcher())"
    mesh = Mesh(np.array(jax.devices()), ("data",))
    everything = (
        DataLoader(Batcher(sorted))
        .batch_size(8)
        .shuffle(seed=3)
        .num_epochs(None)
        .drop_remainder()
        .workers(2, kind="processes")
        .prefetch(5)
        .shard(mesh, "data")
        .device_prefetch(1)
    )
    assert repr(everything) == (
        "DataLoader(Batcher(sorted)).batch_size(8).shuffle(seed=3).num_epochs(None)"
        ".drop_remainder().workers(2, kind='processes').prefetch(5)"
        f".shard(<mesh {{'data': {len(jax.devices())}}}>, 'data').device_prefetch(1)"
    )
    loader = builder.workers(0).num_epochs(2).build(RangeDataset(0, 10).shuffle(seed=0).map(decode))
    assert repr(loader) == (
        "DataLoader(Batcher()).batch_size(32).num_epochs(2).workers(0)"
        ".build(RangeDataset(0, 10).shuffle(seed=0).map(decode))"
    )
    assert repr(builder.build([1, 2, 3])) == (
        "DataLoader(Batcher()).batch_size(32).workers(4).build([1, 2, 3])"
    )


def test_iterators_show_where_they_are() -> None:
    loader = DataLoader(Batcher()).batch_size(2).num_epochs(2).build(RangeDataset(0, 4))
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    assert repr(iterator) == "<BatchIterator at step 2, epoch 1>"
    stream = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 4).filter(keep))
    assert repr(iter(stream)) == "<StreamIterator at step 0, epoch 0>"


def test_no_repr_names_a_memory_address() -> None:
    shown = [
        repr(RangeDataset(0, 3).map(Normalize()).filter(Normalize())),
        repr(DataLoader(Batcher(Normalize())).batch_size(2).build(object.__new__(Opaque2))),
    ]
    assert not [text for text in shown if " at 0x" in text], shown


class Opaque2:
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize("module_name", ["loadax.iterators.stats", "loadax.dataset.names"])
def test_the_examples_of_the_stats_and_names_modules_run(module_name: str) -> None:
    results = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0
    assert results.failed == 0


def test_a_remote_builder_and_loader_show_their_settings() -> None:
    worker = Worker({"numbers": Pipeline(RangeDataset(0, 6), Batcher())}, threads=1)
    try:
        builder = RemoteDataLoader([worker], pipeline="numbers").batch_size(2).shuffle(seed=5)
        assert repr(builder) == "RemoteDataLoader(...).batch_size(2).shuffle(seed=5)"
        with builder.build() as loader:
            assert repr(loader) == "<RemoteLoader of 6 records: batch_size(2).shuffle(seed=5)>"
    finally:
        worker.close()
