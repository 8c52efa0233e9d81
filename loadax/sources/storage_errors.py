"""What a store's error means: the `StorageError` a file source raises for an `OSError` met
reading an object (`explained`), saying what went wrong, what to do about it, and whether it is
an outage worth retrying."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from loadax.errors import StorageError

BUCKETED = {"s3": "s3", "gcs": "gs"}  # pyarrow's type_name -> the scheme its URLs show
# pyarrow reports a store's refusal inside an OSError's text, in the SDK's words (S3's error codes,
# Google Cloud's status codes); fsspec stores raise PermissionError itself.
_DENIED = re.compile(
    r"ACCESS_DENIED|AccessDenied|INVALID_ACCESS_KEY_ID|InvalidAccessKeyId|SIGNATURE_DOES_NOT_MATCH"
    r"|SignatureDoesNotMatch|EXPIRED_TOKEN|ExpiredToken|PERMISSION_DENIED|UNAUTHENTICATED"
    r"|Forbidden|Unauthorized"
)
_NO_BUCKET = re.compile(r"NO_SUCH_BUCKET|NoSuchBucket|Bucket '[^']*' not found")
_NO_OBJECT = re.compile(r"NO_SUCH_KEY|NoSuchKey|RESOURCE_NOT_FOUND")
# An https client talking to a plain-HTTP endpoint (a local MinIO or moto): OpenSSL's words.
_PLAIN_HTTP = re.compile(r"wrong version number|packet length too long|unknown protocol")
_UNREACHABLE = re.compile(
    r"NETWORK_CONNECTION|Could not resolve host|Couldn't connect|Could not connect"
    r"|Connection refused|Connection reset|curlCode|(?<!SERVICE_)UNAVAILABLE"
)
# A store that is there but busy or failing: throttling, timeouts, 5xx (S3's and GCS's words).
_BUSY = re.compile(
    r"SLOW_DOWN|SlowDown|THROTTLING|Throttl|SERVICE_UNAVAILABLE|ServiceUnavailable"
    r"|REQUEST_TIMEOUT|RequestTimeout|TooManyRequests|InternalError|HTTP status (?:5\d\d|429)"
    r"|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|\bINTERNAL\b|Timeout was reached|timed out"
)
# The AWS SDK's name for a 500 and also for an error reply that did not fit a ranged read's
# buffer (a 404 or 403 of a deleted or forbidden object): the object is asked for to tell which.
_AMBIGUOUS = re.compile(r"INTERNAL_FAILURE")
_CREDENTIALS = {
    "s3": (
        "check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or "
        "the machine's role) must name a key allowed to read it (s3:GetObject, and s3:ListBucket "
        "for globs and prefixes), or pass filesystem=pyarrow.fs.S3FileSystem(access_key=..., "
        "secret_key=...)"
    ),
    "gcs": (
        "check the credentials: GOOGLE_APPLICATION_CREDENTIALS (or `gcloud auth "
        "application-default login`) must give an account allowed to read it "
        "(storage.objects.get, and storage.objects.list for globs and prefixes), or pass "
        "filesystem=pyarrow.fs.GcsFileSystem(...)"
    ),
}


class StorageDenied(StorageError, PermissionError):
    """The store refused the credentials: a `StorageError` and a `PermissionError`."""


class StorageNotFound(StorageError, FileNotFoundError):
    """No such object or bucket: a `StorageError` and a `FileNotFoundError`."""


class StorageIsADirectory(StorageError, IsADirectoryError):
    """A prefix of objects named as one: a `StorageError` and an `IsADirectoryError`."""


class StorageUnreachable(StorageError, ConnectionError):
    """The store's endpoint cannot be reached or spoken to: a `StorageError` and a
    `ConnectionError`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Location:
    """One object: its path inside the store's filesystem, and its name in messages (the URL)."""

    path: str
    shown: str


def explained(
    error: OSError, location: Location, source: str, kind: str, filesystem: Any = None
) -> StorageError:
    """The error to raise for `error`, met reading `location` from a store of type `kind`
    (pyarrow's `type_name`): what went wrong, what to do, and whether it is `transient` (an
    outage, worth retrying). `filesystem`, when given, is asked what is missing (the object, its
    bucket, or neither: a directory) and what an ambiguous failure was."""
    text = str(error).strip()
    message = text.splitlines()[0] if text else type(error).__name__
    url = location.shown
    shown = repr(url)
    if isinstance(error, PermissionError) or _DENIED.search(message):
        hint = _CREDENTIALS.get(kind, "check the credentials of the filesystem given")
        return StorageDenied(
            f"{source}: reading {shown} was denied: {hint} ({message})", url, message
        )
    if _PLAIN_HTTP.search(message):
        return StorageUnreachable(
            f"{source}: cannot speak TLS to the store of {shown}: if its endpoint serves plain "
            'HTTP (a local MinIO or moto), pass scheme="http" (S3FileSystem(scheme="http"), '
            "&scheme=http in the URL's query, or AWS_ENDPOINT_URL=http://...) ({message})",
            url,
            message,
        )
    if isinstance(error, ConnectionError | TimeoutError) or _UNREACHABLE.search(message):
        return StorageUnreachable(
            f"{source}: cannot reach the store of {shown}: check the endpoint "
            f"(endpoint_override, or AWS_ENDPOINT_URL for S3) and the network ({message})",
            url,
            message,
            transient=True,
        )
    if _AMBIGUOUS.search(message) and filesystem is not None:
        try:
            found = filesystem.get_file_info(location.path).type
        except OSError as asked:  # the store says why now, in plainer words
            return explained(asked, location, source, kind)
        if found == arrow_fs(source).FileType.NotFound:
            return _missing(location, source, message, kind, filesystem)
    if _BUSY.search(message) or _AMBIGUOUS.search(message):
        return StorageError(
            f"{source}: the store of {shown} is busy or failing ({message})",
            url,
            message,
            transient=True,
        )
    if (
        isinstance(error, FileNotFoundError)
        or _NO_BUCKET.search(message)
        or _NO_OBJECT.search(message)
    ):
        return _missing(location, source, message, kind, filesystem)
    return StorageError(f"{source}: cannot read {shown}: {message}", url, message)


def _missing(
    location: Location, source: str, message: str, kind: str, filesystem: Any
) -> StorageError:
    fs = arrow_fs(source)
    bucket = location.path.split("/", 1)[0]
    bucket_gone = bool(_NO_BUCKET.search(message))
    if filesystem is not None and not bucket_gone:
        try:
            found = filesystem.get_file_info(location.path).type
        except OSError:  # the store refuses to say more: the first error is the answer
            found = fs.FileType.NotFound
        if found == fs.FileType.Directory:
            return StorageIsADirectory(
                f"{source}: {location.shown!r} is a directory (a prefix of objects), not a file: "
                "name its objects in the order you want, or a glob such as "
                "'s3://bucket/prefix/*.parquet'",
                location.shown,
                message,
            )
        bucket_gone = no_bucket(filesystem, kind, bucket, source)
    if bucket_gone:
        return bucket_missing(bucket, location.shown, source, message)
    return StorageNotFound(
        f"{source}: no object at {location.shown!r}: check the name against a listing of its "
        f"prefix ({message})",
        location.shown,
        message,
    )


def no_bucket(filesystem: Any, kind: str, bucket: str, source: str) -> bool:
    """Whether the store says that `bucket` does not exist (False when it will not say)."""
    if kind not in BUCKETED or not bucket:
        return False
    try:
        return bool(filesystem.get_file_info(bucket).type == arrow_fs(source).FileType.NotFound)
    except OSError:
        return False


def bucket_missing(bucket: str, shown: str, source: str, message: str) -> StorageNotFound:
    return StorageNotFound(
        f"{source}: the bucket {bucket!r} of {shown!r} does not exist (or is not visible with "
        f"these credentials): check its name and the endpoint ({message})",
        shown,
        message,
    )


def arrow_fs(source: str) -> Any:
    """`pyarrow.fs`, or an ImportError that says how to install it."""
    try:
        import pyarrow.fs  # type: ignore[import-untyped]
    except ImportError as error:
        raise ImportError(
            f"{source} reads object stores and given filesystems with pyarrow, which is not "
            "installed: pip install 'loadax[s3]' (or 'loadax[gcs]')"
        ) from error
    return pyarrow.fs
