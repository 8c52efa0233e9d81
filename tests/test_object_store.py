"""Tests for object stores (loadax/sources/filesystems.py and the file sources that read through
it): Parquet, .npy and image folders read from a real S3-compatible server on loopback (moto in
server mode, in a process of its own, checking every request's credentials) give the records of
the same files read locally, with errors that name the URL for what is missing or refused."""

from __future__ import annotations

import io
import pickle
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
import table_pipelines
from helpers import assert_batches_equal, assert_records_equal
from moto_server import BUCKET, Moto
from PIL import Image

from loadax import Batcher, DataLoader, ImageFolderDataset, NumpyDataset, Pipeline
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker
from loadax.sources.filesystems import path_in_store, store_of
from loadax.sources.parquet import ParquetDataset

RECORDS = 40


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, moto: Moto) -> Path:
    """The data, locally, and uploaded to s3://bucket/ under the same names: three Parquet files
    (train/rows-*.parquet), a .npy file, and a class-per-directory tree of tiny PNGs (images/)."""
    directory = tmp_path_factory.mktemp("data")
    (directory / "train").mkdir()
    table_pipelines.write_parquet_rows(directory / "train", RECORDS)
    np.save(directory / "rows.npy", np.arange(28 * 7 * 3, dtype=">i4").reshape(28, 7, 3))
    rng = np.random.default_rng(0)
    for name in ("cat/1.png", "cat/nested/2.png", "cat/.hidden.png", "dog/1.png", "emu/1.png"):
        path = directory / "images" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)).save(path)
    store = moto.filesystem()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            key = f"{BUCKET}/{path.relative_to(directory).as_posix()}"
            pafs.copy_files(str(path), key, destination_filesystem=store)
    return directory


def local_parquet(local: Path) -> list[Path]:
    return sorted((local / "train").glob("*.parquet"))


def loaded(dataset: Any, kind: str = "threads") -> list[Any]:
    builder = DataLoader(Batcher()).batch_size(6).shuffle(seed=3).num_epochs(2)
    return list(builder.workers(2, kind=kind).build(dataset))  # type: ignore[arg-type]


# --- Parquet ---------------------------------------------------------------------------------


def test_urls_and_globs_give_the_records_of_the_local_files(
    moto: Moto, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto.environment(monkeypatch)
    expected = list(ParquetDataset(local_parquet(local)))
    urls = [f"s3://{BUCKET}/train/rows-{number}.parquet" for number in range(3)]
    globbed = ParquetDataset(f"s3://{BUCKET}/train/*.parquet")
    assert globbed.paths == tuple(urls)
    assert_records_equal(list(globbed), expected)
    assert_records_equal(list(ParquetDataset(urls[::-1]))[:14], expected[-14:])
    assert_records_equal(
        list(ParquetDataset(f"s3://{BUCKET}/**/rows-[02].parquet"))[:13], expected[:13]
    )
    # Options in the URL's query instead of the environment; never shown again.
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    options = f"?endpoint_override={moto.endpoint}&scheme=http&region=us-east-1"
    with_options = ParquetDataset(urls[1] + options, columns=["label"])
    assert with_options.paths == (urls[1],)
    assert [record["label"] for record in with_options] == [i % 7 for i in range(13, 26)]


def test_a_filesystem_takes_paths_and_globs_in_it(moto: Moto, local: Path) -> None:
    expected = list(ParquetDataset(local_parquet(local)))
    dataset = ParquetDataset(f"{BUCKET}/train/rows-*.parquet", filesystem=moto.filesystem())
    assert dataset.paths == tuple(f"s3://{BUCKET}/train/rows-{n}.parquet" for n in range(3))
    assert_records_equal(list(dataset), expected)


def test_loaders_give_the_local_batches_in_threads_processes_and_a_worker(
    moto: Moto, local: Path
) -> None:
    expected = loaded(ParquetDataset(local_parquet(local)))
    dataset = ParquetDataset(f"s3://{BUCKET}/train/*.parquet", filesystem=moto.filesystem())
    assert_batches_equal(loaded(dataset), expected)
    # Process workers unpickle it by its URLs and the filesystem's options (the keys included):
    # the forkserver's environment has neither.
    assert_batches_equal(loaded(dataset, kind="processes"), expected)
    worker = Worker({"rows": Pipeline(dataset, Batcher())}, threads=2)
    try:
        remote = RemoteDataLoader([worker], pipeline="rows").batch_size(6).shuffle(seed=3)
        with remote.num_epochs(2).build() as batches:
            assert_batches_equal(batches, expected)
    finally:
        worker.close()


def test_it_pickles_by_url_and_options_never_by_handle(moto: Moto, local: Path) -> None:
    dataset = ParquetDataset(f"s3://{BUCKET}/train/*.parquet", filesystem=moto.filesystem())
    dataset[0]
    assert len(dataset._states) == 1  # a thread's filesystem, file and row group
    pickled = pickle.dumps(dataset)
    assert f"{BUCKET}/train/rows-2.parquet".encode() in pickled
    assert b"*" not in pickled  # the glob's matches, not the glob: a new listing may differ
    copy = pickle.loads(pickled)
    assert len(copy._states) == 0
    assert_records_equal(list(copy), list(dataset))


class CountingHandler(pafs.FileSystemHandler):  # type: ignore[misc]
    """An S3 filesystem, through pyarrow's Python filesystem: counts the bytes its files read."""

    reads: list[int] = []  # noqa: RUF012 - shared by every thread's copy, on purpose

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return self is other

    def get_file_info(self, paths: list[str]) -> Any:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.inner.get_file_info(selector)

    def open_input_file(self, path: str) -> Any:
        return pa.PythonFile(_Counted(self.inner.open_input_file(path)), mode="r")

    def open_input_stream(self, path: str) -> Any:
        return self.open_input_file(path)

    def create_dir(self, *args: Any) -> None:
        raise NotImplementedError

    delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = create_dir
    move = copy_file = open_output_stream = open_append_stream = create_dir


class _Counted(io.RawIOBase):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def read(self, size: int = -1) -> bytes:
        data = bytes(self.inner.read(size))
        CountingHandler.reads.append(len(data))
        return data

    def close(self) -> None:
        self.inner.close()
        super().close()


def test_a_read_fetches_the_footer_and_one_row_group_not_the_object(moto: Moto) -> None:
    rng = np.random.default_rng(1)
    table = pa.table({"a": rng.random(64 * 1024), "b": rng.random(64 * 1024)})
    store = moto.filesystem()
    with store.open_output_stream(f"{BUCKET}/big.parquet") as stream:
        pq.write_table(table, stream, row_group_size=8 * 1024, compression="none")
    size = store.get_file_info(f"{BUCKET}/big.parquet").size
    counting = pafs.PyFileSystem(CountingHandler(store))
    CountingHandler.reads.clear()
    dataset = ParquetDataset(f"{BUCKET}/big.parquet", columns=["a"], filesystem=counting)
    footer = sum(CountingHandler.reads)
    assert dataset[20_000]["a"] == table["a"][20_000].as_py()
    row_group = sum(CountingHandler.reads) - 2 * footer  # the reading thread read it again
    # 8 row groups of 2 columns of 64 KiB: the read fetched one column of one group.
    assert 0 < footer < size / 16
    assert 8 * 1024 * 8 <= row_group < 2 * 8 * 1024 * 8, (row_group, size)  # not both columns


def test_each_thread_reads_through_its_own_filesystem_and_files(moto: Moto, local: Path) -> None:
    dataset = ParquetDataset(f"s3://{BUCKET}/train/*.parquet", filesystem=moto.filesystem())
    expected = list(ParquetDataset(local_parquet(local)))
    barrier = threading.Barrier(3)

    def read(offset: int) -> list[dict[str, Any]]:
        barrier.wait()
        return dataset.__getitems__([(offset + 7 * i) % RECORDS for i in range(RECORDS)])

    with ThreadPoolExecutor(3) as pool:
        for offset, records in enumerate(pool.map(read, range(3))):
            assert_records_equal(records, [expected[(offset + 7 * i) % RECORDS] for i in range(40)])
    states = dataset._states.handles()
    assert len(states) == 3
    filesystems = {id(state.filesystem) for state in states}
    files = {id(handle) for state in states for handle in state.files.values()}
    assert len(filesystems) == 3
    assert len(files) == 9
    assert id(dataset._store.filesystem) not in filesystems
    dataset.close()
    assert len(dataset._states) == 0


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        (
            "s3://bucket/train/rows-9.parquet",
            FileNotFoundError,
            r"no object at 's3://bucket/train/rows-9\.parquet': check the name",
        ),
        (
            "s3://no-such-bucket/rows.parquet",
            FileNotFoundError,
            r"the bucket 'no-such-bucket' of 's3://no-such-bucket/rows\.parquet' does not exist",
        ),
        (
            "s3://no-such-bucket/*.parquet",
            FileNotFoundError,
            r"the bucket 'no-such-bucket' of 's3://no-such-bucket/\*\.parquet' does not exist",
        ),
        (
            "s3://bucket/train/*.csv",
            FileNotFoundError,
            r"no object matches 's3://bucket/train/\*\.csv'",
        ),
        ("s3://bucket/train", IsADirectoryError, r"'s3://bucket/train' is a directory .* a glob"),
        ("s3://bucket/rows.npy", ValueError, r"'s3://bucket/rows\.npy' is not a readable Parquet"),
    ],
)
def test_what_is_missing_is_named_with_its_url(
    moto: Moto, local: Path, path: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^ParquetDataset: {message}"):
        ParquetDataset(path, filesystem=moto.filesystem())


@pytest.mark.parametrize("who", ["unknown key", "wrong secret", "key without a policy"])
def test_refused_credentials_are_a_permission_error_that_says_what_to_check(
    moto: Moto, local: Path, who: str
) -> None:
    key, secret = {
        "unknown key": ("AKIAUNKNOWN000000000", "secret"),
        "wrong secret": (moto.key, "not-the-secret"),
        "key without a policy": moto.stranger,
    }[who]
    filesystem = moto.filesystem(key, secret)
    denied = r"^ParquetDataset: reading 's3://bucket/train/rows-0\.parquet' was denied: "
    checks = "check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    with pytest.raises(PermissionError, match=denied + checks):
        ParquetDataset(f"{BUCKET}/train/rows-0.parquet", filesystem=filesystem)
    with pytest.raises(
        PermissionError,
        match=r"^ParquetDataset: reading 's3://bucket/train/\*\.parquet' was denied",
    ):
        ParquetDataset(f"{BUCKET}/train/*.parquet", filesystem=filesystem)
    with pytest.raises(
        PermissionError, match=r"^NumpyDataset: reading 's3://bucket/rows\.npy' was denied"
    ):
        NumpyDataset(f"{BUCKET}/rows.npy", filesystem=filesystem)
    with pytest.raises(
        PermissionError, match=r"^ImageFolderDataset: reading 's3://bucket/images' was denied"
    ):
        ImageFolderDataset(f"{BUCKET}/images", filesystem=filesystem)


def test_credentials_refused_after_the_listing_fail_the_read_naming_the_url(
    moto: Moto, local: Path
) -> None:
    dataset = ParquetDataset(f"{BUCKET}/train/rows-0.parquet", filesystem=moto.filesystem())
    dataset._store.filesystem = moto.filesystem(*moto.stranger)  # the next thread's copy
    with pytest.raises(
        PermissionError, match=r"reading 's3://bucket/train/rows-0\.parquet' was denied"
    ):
        dataset[0]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_unreachable_endpoint_is_named(scheme: str) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{closed.getsockname()[1]}"  # nothing listens once closed
    if scheme == "s3":
        filesystem = pafs.S3FileSystem(
            access_key="k",
            secret_key="s",
            endpoint_override=endpoint,
            scheme="http",
            region="us-east-1",
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
    else:
        filesystem = pafs.GcsFileSystem(
            anonymous=True,
            endpoint_override=endpoint,
            scheme="http",
            retry_time_limit=timedelta(seconds=0.2),
        )
    with pytest.raises(
        ConnectionError,
        match=rf"cannot reach the store of '{scheme}://bucket/x\.parquet': check the endpoint",
    ):
        ParquetDataset("bucket/x.parquet", filesystem=filesystem)


def test_bad_locations_and_filesystems_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'data/a\.parquet' is a local path among URLs"):
        ParquetDataset(["s3://bucket/a.parquet", "data/a.parquet"])
    with pytest.raises(ValueError, match=r"'gs://bucket/b\.parquet' names another store than"):
        ParquetDataset(["s3://bucket/a.parquet", "gs://bucket/b.parquet"])
    with pytest.raises(
        ValueError,
        match=r"cannot read 'hdfs://host/a\.parquet': URLs are read for the schemes gcs, gs, s3",
    ):
        ParquetDataset("hdfs://host/a.parquet")
    with pytest.raises(
        ValueError,
        match=r"filesystem must be a pyarrow\.fs\.FileSystem or an fsspec filesystem, got 'local'",
    ):
        NumpyDataset("a.npy", filesystem="local")


def test_gs_urls_make_a_gcs_filesystem_and_show_without_credentials_or_options() -> None:
    found = store_of(
        ["gs://bucket/train/a.parquet?retry_limit_seconds=1"], None, "ParquetDataset", expand=False
    )
    assert found is not None
    store, [location] = found
    assert store.kind == "gcs"
    assert (location.path, location.shown) == (
        "bucket/train/a.parquet",
        "gs://bucket/train/a.parquet",
    )
    assert path_in_store("s3://key:secret@bucket/a/b?region=x") == "bucket/a/b"
    assert path_in_store("bucket/a") == "bucket/a"


# --- NumpyDataset ----------------------------------------------------------------------------


def test_npy_rows_are_read_by_ranges_and_equal_the_local_rows(
    moto: Moto, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto.environment(monkeypatch)
    array = np.load(local / "rows.npy")
    dataset = NumpyDataset(f"s3://{BUCKET}/rows.npy")
    assert (len(dataset), dataset.path) == (28, f"s3://{BUCKET}/rows.npy")
    indices = np.array([27, 3, 4, 5, 5, 0, 12, 11])
    rows = dataset.read_rows(indices, 0)
    assert rows.dtype == np.dtype(">i4")
    np.testing.assert_array_equal(rows, array[indices])
    np.testing.assert_array_equal(
        NumpyDataset(f"s3://{BUCKET}/rows.npy", mmap=False)[-1], array[-1]
    )
    assert_batches_equal(loaded(dataset), loaded(NumpyDataset(local / "rows.npy")))
    copy = pickle.loads(
        pickle.dumps(NumpyDataset(f"{BUCKET}/rows.npy", filesystem=moto.filesystem()))
    )
    np.testing.assert_array_equal(copy[7], array[7])


def test_a_fortran_ordered_npy_object_is_refused_unless_read_whole(moto: Moto) -> None:
    array = np.asfortranarray(np.arange(12.0).reshape(4, 3))
    buffer = io.BytesIO()
    np.save(buffer, array)
    store = moto.filesystem()
    with store.open_output_stream(f"{BUCKET}/fortran.npy") as stream:
        stream.write(buffer.getvalue())
    with pytest.raises(ValueError, match=r"'s3://bucket/fortran\.npy' is Fortran-ordered"):
        NumpyDataset(f"{BUCKET}/fortran.npy", filesystem=store)
    whole = NumpyDataset(f"{BUCKET}/fortran.npy", mmap=False, filesystem=store)
    np.testing.assert_array_equal(whole[2], array[2])


# --- ImageFolderDataset ----------------------------------------------------------------------


def test_an_image_folder_in_a_bucket_gives_the_local_records(
    moto: Moto, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto.environment(monkeypatch)
    expected = ImageFolderDataset(local / "images")
    dataset = ImageFolderDataset(f"s3://{BUCKET}/images")
    assert dataset.root == f"s3://{BUCKET}/images"
    assert dataset.classes == expected.classes == ("cat", "dog", "emu")
    assert len(dataset) == len(expected) == 4  # the hidden file is skipped in both
    for got, want in zip(dataset, expected, strict=True):
        assert got["label"] == want["label"]
        np.testing.assert_array_equal(got["image"], want["image"])
    raw = ImageFolderDataset(f"{BUCKET}/images", decode=False, filesystem=moto.filesystem())
    assert raw[1]["image"].tobytes() == (local / "images/cat/nested/2.png").read_bytes()
    copy = pickle.loads(pickle.dumps(raw))
    assert copy.root == f"s3://{BUCKET}/images"
    assert copy[3]["image"].tobytes() == (local / "images/emu/1.png").read_bytes()
    with pytest.raises(FileNotFoundError, match=r"no directory at 's3://bucket/nothing'"):
        ImageFolderDataset(f"s3://{BUCKET}/nothing")
    with pytest.raises(
        FileNotFoundError,
        match=r"the bucket 'no-such-bucket' of 's3://no-such-bucket/images' does not exist",
    ):
        ImageFolderDataset("s3://no-such-bucket/images")


# --- fsspec ----------------------------------------------------------------------------------


def test_an_fsspec_filesystem_is_read_like_a_pyarrow_one(local: Path) -> None:
    filesystem = fsspec.filesystem("file")
    pattern = (local / "train" / "rows-*.parquet").as_posix()
    dataset = ParquetDataset(pattern, filesystem=filesystem)
    assert dataset.paths == tuple(path.as_posix() for path in local_parquet(local))
    expected = list(ParquetDataset(local_parquet(local)))
    assert_records_equal(list(dataset), expected)
    assert_records_equal(list(pickle.loads(pickle.dumps(dataset))), expected)
    images = ImageFolderDataset((local / "images").as_posix(), filesystem=filesystem)
    assert [record["label"] for record in images] == [0, 0, 1, 2]
    with pytest.raises(FileNotFoundError, match=r"no object at '.*absent\.parquet'"):
        ParquetDataset((local / "absent.parquet").as_posix(), filesystem=filesystem)
