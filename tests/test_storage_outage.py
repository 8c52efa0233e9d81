"""Storage outages are retried, not blamed on records (loadax/sources/retries.py and the errors of
loadax/sources/filesystems.py): a real moto S3 server on loopback is killed mid-epoch and started
again, stays down, loses an object or a permission, or is spoken to over the wrong scheme."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pytest
import table_pipelines
from helpers import assert_batches_equal
from moto_server import BUCKET, Moto, SeededMoto

from loadax import Batcher, DataLoader, NumpyDataset, RecordError, RetryPolicy, StorageError
from loadax.sources.parquet import ParquetDataset
from loadax.sources.storage_errors import Location, explained

RECORDS = 40
QUICK = RetryPolicy(attempts=100, initial_s=0.05, longest_s=0.2, total_s=20.0)
SLOW = RetryPolicy(initial_s=10.0, longest_s=10.0)  # a single retry would wait 5 s or more
ONE_TRY = pafs.AwsStandardS3RetryStrategy(max_attempts=1)  # pyarrow's own retries off


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Parquet files of 40 rows in row groups of 4 (train/), and a .npy file (rows.npy)."""
    directory = tmp_path_factory.mktemp("data")
    (directory / "train").mkdir()
    table_pipelines.write_parquet_rows(directory / "train", RECORDS)
    np.save(directory / "rows.npy", np.arange(RECORDS * 6, dtype=">i4").reshape(RECORDS, 6))
    return directory


@pytest.fixture
def server(data: Path, tmp_path: Path) -> Iterator[SeededMoto]:
    server = SeededMoto(data, tmp_path / "moto.log")
    try:
        yield server
    finally:
        server.close()


def local(kind: str, data: Path) -> Any:
    """The Parquet files or the .npy file, read from the local disk."""
    if kind == "parquet":
        return ParquetDataset(sorted((data / "train").glob("*.parquet")))
    return NumpyDataset(data / "rows.npy")


def stored(kind: str, filesystem: Any, retries: RetryPolicy) -> Any:
    """The Parquet files or the .npy file, read from the server through `filesystem`."""
    if kind == "parquet":
        return ParquetDataset(f"{BUCKET}/train/*.parquet", filesystem=filesystem, retries=retries)
    return NumpyDataset(f"{BUCKET}/rows.npy", filesystem=filesystem, retries=retries)


def loader(records: Any, threads: int = 2) -> Any:
    builder = DataLoader(Batcher()).batch_size(4).shuffle(seed=3).num_epochs(2)
    return builder.workers(threads).build(records)


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "loadax.sources.retries"]


class Retrying(logging.Handler):
    """`retrying` is set once a source logs its first retry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.retrying = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.retrying.set()


@pytest.mark.parametrize("kind", ["parquet", "npy"])
def test_an_outage_mid_epoch_is_retried_and_the_batches_are_those_of_an_undisturbed_run(
    server: SeededMoto, data: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "loadax.sources.retries")
    expected = list(loader(local(kind, data)))
    batches = iter(loader(stored(kind, server.filesystem(), QUICK)))
    got = [next(batches)]
    server.kill()
    # Started again (same port, same objects) once a read is being retried: pyarrow's own few
    # retries within each attempt (its default; a pickled S3FileSystem drops retry_strategy, so
    # the reading threads' copies have it) have then failed, as they did before this change.
    sources = logging.getLogger("loadax.sources.retries")
    handler = Retrying()
    sources.addHandler(handler)

    def restart_once_retrying() -> None:
        if handler.retrying.wait(60):
            server.start()

    restart = threading.Thread(target=restart_once_retrying)
    restart.start()
    try:
        got.extend(batches)
    finally:
        sources.removeHandler(handler)
        handler.retrying.set()
        restart.join()
    assert_batches_equal(got, expected)
    warnings = retry_warnings(caplog)
    assert "cannot reach the store of 's3://bucket/" in warnings[0]
    assert "(attempt 1 of 100); retrying in" in warnings[0]


def test_a_store_that_stays_down_raises_a_storage_error_once_the_retries_are_spent(
    server: SeededMoto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "loadax.sources.retries")
    retries = RetryPolicy(attempts=100, initial_s=0.05, longest_s=0.1, total_s=0.5)
    # Read in the calling thread: one read meets the outage, and nothing is left in flight.
    with iter(loader(stored("parquet", server.filesystem(), retries), threads=0)) as batches:
        next(batches)
        server.kill()
        killed = time.monotonic()
        with pytest.raises(StorageError) as raised:
            list(batches)
        spent = time.monotonic() - killed
    error = raised.value
    assert not isinstance(error, RecordError)
    assert isinstance(error, ConnectionError)
    assert error.transient
    assert error.url.startswith("s3://bucket/train/rows-")
    assert f"cannot reach the store of {error.url!r}" in str(error)
    assert "Could not connect" in error.reason
    assert error.reason in str(error)
    assert "gave up after" in str(error)
    assert retry_warnings(caplog)
    # Each attempt is pyarrow's few tries (about 3 s); the second one ends past total_s.
    assert spent < 30, spent


@pytest.fixture
def checked(tmp_path: Path, data: Path) -> Iterator[Moto]:
    """A server checking credentials, holding the Parquet files."""
    server = Moto(tmp_path)
    try:
        store = server.filesystem()
        for path in sorted((data / "train").glob("*.parquet")):
            pafs.copy_files(str(path), f"{BUCKET}/train/{path.name}", destination_filesystem=store)
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("failure", ["deleted", "denied"])
def test_a_refusal_mid_run_is_raised_at_once_as_a_storage_error_naming_the_url(
    checked: Moto, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "loadax.sources.retries")
    # Closed before the server, so that no read in flight meets a dead server (and retries).
    with iter(loader(stored("parquet", checked.filesystem(), SLOW))) as batches:
        next(batches)
        if failure == "deleted":  # a 404 for every object from now on
            for number in range(3):
                checked.filesystem().delete_file(f"{BUCKET}/train/rows-{number}.parquet")
        else:  # a 403: the reader's key stays valid but may no longer read
            checked.iam(*checked.admin).delete_user_policy(UserName="reader", PolicyName="s3")
        refused = time.monotonic()
        with pytest.raises(StorageError) as raised:
            list(batches)
        assert time.monotonic() - refused < 4  # a retry under SLOW would wait 5 s
    expected = FileNotFoundError if failure == "deleted" else PermissionError
    error = raised.value
    assert isinstance(error, expected)
    assert not error.transient
    assert error.url.startswith("s3://bucket/train/rows-")
    said = f"no object at {error.url!r}" if failure == "deleted" else f"{error.url!r} was denied"
    assert said in str(error)
    assert retry_warnings(caplog) == []


class FailingStore(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint whose every object is 1000 bytes and whose every read fails with
    `status` and the S3 error `code`; HEAD fails too unless `head_ok`."""

    status, code, head_ok = 503, "SlowDown", True

    def do_HEAD(self) -> None:
        self.send_response(200 if self.head_ok else self.status)
        self.send_header("Content-Length", "1000")
        self.send_header("Last-Modified", "Wed, 21 Oct 2015 07:28:00 GMT")
        self.end_headers()

    def do_GET(self) -> None:
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{self.code}</Code>"
            "<Message>refused</Message></Error>"
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *arguments: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "code", "head_ok", "kind", "transient"),
    [
        (503, "SlowDown", True, StorageError, True),
        (503, "ServiceUnavailable", True, StorageError, True),
        (500, "InternalError", True, StorageError, True),
        (429, "TooManyRequests", True, StorageError, True),
        (503, "SlowDown", False, StorageError, True),
        (403, "AccessDenied", False, PermissionError, False),
        (404, "NoSuchKey", False, FileNotFoundError, False),
    ],
)
def test_throttling_and_5xx_are_transient_refusals_are_not(
    status: int, code: str, head_ok: bool, kind: type[Exception], transient: bool
) -> None:
    handler = type("Handler", (FailingStore,), {"status": status, "code": code, "head_ok": head_ok})
    endpoint = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        filesystem = pafs.S3FileSystem(
            access_key="key",
            secret_key="secret",
            endpoint_override=f"127.0.0.1:{endpoint.server_port}",
            scheme="http",
            region="us-east-1",
            retry_strategy=ONE_TRY,
        )
        location = Location(f"{BUCKET}/rows.npy", f"s3://{BUCKET}/rows.npy")
        # A small ranged read, a large one, and a whole object: the SDK words each differently.
        reads: list[Callable[[], Any]] = [
            lambda: filesystem.open_input_file(location.path).read_at(10, 0),
            lambda: filesystem.open_input_file(location.path).read_at(900, 0),
            lambda: filesystem.open_input_stream(location.path).read(),
        ]
        for read in reads:
            with pytest.raises(OSError, match=r"AWS Error|does not exist") as raised:
                read()
            error = explained(raised.value, location, "NumpyDataset", "s3", filesystem)
            assert isinstance(error, kind), error
            assert error.transient is transient, error
            assert error.url == "s3://bucket/rows.npy"
            assert error.url in str(error)
    finally:
        endpoint.shutdown()
        endpoint.server_close()


def test_an_https_client_of_a_plain_http_endpoint_is_told_to_pass_scheme_http(
    server: SeededMoto,
) -> None:
    https = pafs.S3FileSystem(
        access_key="key",
        secret_key="secret",
        endpoint_override=server.endpoint,  # no scheme="http": pyarrow speaks https
        region="us-east-1",
        retry_strategy=ONE_TRY,
    )
    started = time.monotonic()
    with pytest.raises(StorageError, match='pass scheme="http"') as raised:
        ParquetDataset(f"{BUCKET}/train/rows-0.parquet", filesystem=https, retries=SLOW)
    assert time.monotonic() - started < 4  # a misconfiguration: never retried
    assert isinstance(raised.value, ConnectionError)
    assert not raised.value.transient
    assert "'s3://bucket/train/rows-0.parquet'" in str(raised.value)


def test_a_retry_policy_names_a_bad_field_and_sources_refuse_anything_else() -> None:
    with pytest.raises(ValueError, match=r"RetryPolicy: attempts must be an int >= 1, got 0"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match=r"longest_s \(1\.0\) must be at least initial_s \(2\.0\)"):
        RetryPolicy(initial_s=2.0, longest_s=1.0)
    with pytest.raises(ValueError, match=r"retries must be a loadax\.RetryPolicy, got 3"):
        ParquetDataset("s3://bucket/a.parquet", retries=3)  # type: ignore[arg-type]
