"""Where a file source's files live when they are not local paths: objects in a store named by
URL (`s3://`, `gs://`) or in a filesystem the user gives (pyarrow's or fsspec's); reads retried
through outages; errors that say what to do.

pyarrow, which reads the stores, is imported only when a URL or a filesystem is given, so that
`import loadax` never needs it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import pickle
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from loadax.errors import StorageError
from loadax.sources.handles import HandlePool
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy, retried

R = TypeVar("R")

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_GLOB = re.compile(r"[*?[]")
_BUCKETED = {"s3": "s3", "gcs": "gs"}  # pyarrow's type_name -> the scheme its URLs show
_KINDS = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}  # a URL's scheme -> pyarrow's type_name
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


def is_url(path: object) -> bool:
    """Whether `path` is a str naming a store by URL (`s3://...`, `gs://...`)."""
    return isinstance(path, str) and _URL.match(path) is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Location:
    """One object: its path inside the store's filesystem, and its name in messages (the URL)."""

    path: str
    shown: str


class Store:
    """A pyarrow filesystem that a source reads objects from, made from a URL or given.

    It pickles as what it was made from: the given filesystem (pyarrow's pickle as their options,
    fsspec's as their arguments), never open connections or files. Each reading thread takes its
    own copy from `filesystems()` and opens its own files on it.
    """

    def __init__(self, given: Any, filesystem: Any, retries: RetryPolicy) -> None:
        self._given = given  # what the user passed, or the filesystem a URL made
        self.filesystem = filesystem  # a pyarrow.fs.FileSystem (fsspec's wrapped)
        self.kind: str = filesystem.type_name  # "s3", "gcs", "local", "py::fsspec+..."
        self.retries = retries

    @classmethod
    def given(cls, filesystem: Any, source: str, retries: RetryPolicy) -> Store:
        """The store of a `filesystem=` argument: a `pyarrow.fs.FileSystem` or an fsspec one."""
        fs = _arrow_fs(source)
        if isinstance(filesystem, fs.FileSystem):
            return cls(filesystem, filesystem, retries)
        fsspec = sys.modules.get("fsspec")  # an fsspec filesystem's module is imported already
        if fsspec is not None and isinstance(filesystem, fsspec.AbstractFileSystem):
            return cls(filesystem, fs.PyFileSystem(fs.FSSpecHandler(filesystem)), retries)
        raise ValueError(
            f"{source}: filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, "
            f"got {filesystem!r}"
        )

    @property
    def user_filesystem(self) -> Any:
        """The filesystem to pass again as `filesystem=` (for pickling a source)."""
        return self._given

    def copy(self) -> Any:
        """A new pyarrow filesystem with the same options: one thread's own."""
        return pickle.loads(pickle.dumps(self.filesystem))

    def filesystems(self) -> HandlePool[Any]:
        """A pool of `copy()`s, one per reading thread."""
        return HandlePool(self.copy, _forget)

    def shown(self, path: str) -> str:
        """The name of the object at `path` in messages: its URL on a bucketed store (never
        with the options or credentials a URL may carry)."""
        scheme = _BUCKETED.get(self.kind)
        return f"{scheme}://{path}" if scheme is not None else path

    def kind_of(self, location: Location, source: str) -> str | None:
        """What is at `location`: "file", "directory", or None for nothing."""
        fs = _arrow_fs(source)
        try:
            found = self.filesystem.get_file_info(location.path).type
        except OSError as error:
            raise self.explain(error, location, source) from None
        if found == fs.FileType.NotFound:
            bucket = location.path.split("/", 1)[0]
            if _no_bucket(self.filesystem, self.kind, bucket, source):
                raise _bucket_missing(bucket, location.shown, source, "no such bucket")
            return None
        return "directory" if found == fs.FileType.Directory else "file"

    def listing(self, location: Location, recursive: bool, source: str) -> list[tuple[str, bool]]:
        """The entries under the directory `location`, at any depth when `recursive`: each as
        its "/"-separated path relative to it, and whether it is a directory."""
        fs = _arrow_fs(source)
        try:
            infos = self.filesystem.get_file_info(
                fs.FileSelector(location.path, recursive=recursive)
            )
        except OSError as error:
            raise self.explain(error, location, source) from None
        start = len(location.path.rstrip("/")) + 1
        return [(info.path[start:], info.type == fs.FileType.Directory) for info in infos]

    def read(self, filesystem: Any, location: Location, source: str) -> bytes:
        """The whole object at `location`, read from `filesystem` (a thread's copy), retried."""

        def read_once() -> bytes:
            try:
                with filesystem.open_input_stream(location.path) as stream:
                    return bytes(stream.read())
            except OSError as error:
                raise self.explain(error, location, source) from None

        return self.retried(read_once)

    def retried(self, read: Callable[[], R]) -> R:
        """`read()`, a read of records that raises `explain`ed errors, tried again under the
        store's `RetryPolicy` while its error is transient."""
        return retried(read, self.retries)

    def locations(self, names: Sequence[str], source: str, expand: bool = True) -> list[Location]:
        """The objects `names` (paths in the store or URLs of it, and globs when `expand`) name,
        in order; a glob's matches sorted, and a glob matching nothing refused."""
        found: list[Location] = []
        for name in names:
            path = path_in_store(name)
            if not expand or _GLOB.search(path) is None:
                found.append(Location(path, self.shown(path)))
                continue
            matches = self.glob(path, source)
            if not matches:
                raise self._unmatched(path, source)
            found.extend(Location(match, self.shown(match)) for match in matches)
        return found

    def glob(self, pattern: str, source: str) -> list[str]:
        """The sorted paths of the files matching `pattern`: `*`, `?` and `[...]` within one
        path component, `**` across any number of them."""
        parts = pattern.split("/")
        fixed = next(i for i, part in enumerate(parts) if _GLOB.search(part))
        base = "/".join(parts[:fixed])
        rest = parts[fixed:]
        fs = _arrow_fs(source)
        selector = fs.FileSelector(
            base, recursive="**" in rest or len(rest) > 1, allow_not_found=True
        )
        try:
            infos = self.filesystem.get_file_info(selector)
        except OSError as error:
            raise self.explain(error, Location(base, self.shown(pattern)), source) from None
        prefix = len(base) + 1 if base else 0
        return sorted(
            info.path
            for info in infos
            if info.type == fs.FileType.File and _matches(info.path[prefix:].split("/"), rest)
        )

    def _unmatched(self, pattern: str, source: str) -> FileNotFoundError:
        shown = self.shown(pattern)
        bucket = pattern.split("/", 1)[0]
        if not _GLOB.search(bucket) and _no_bucket(self.filesystem, self.kind, bucket, source):
            return _bucket_missing(bucket, shown, source, "no object matches")
        return FileNotFoundError(f"{source}: no object matches {shown!r}")

    def explain(self, error: OSError, location: Location, source: str) -> StorageError:
        """The error to raise for `error`, met reading `location`: what went wrong, and what
        to do about it."""
        return explained(error, location, source, self.kind, self.filesystem)


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
        if found == _arrow_fs(source).FileType.NotFound:
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
    fs = _arrow_fs(source)
    bucket = location.path.split("/", 1)[0]
    no_bucket = bool(_NO_BUCKET.search(message))
    if filesystem is not None and not no_bucket:
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
        no_bucket = _no_bucket(filesystem, kind, bucket, source)
    if no_bucket:
        return _bucket_missing(bucket, location.shown, source, message)
    return StorageNotFound(
        f"{source}: no object at {location.shown!r}: check the name against a listing of its "
        f"prefix ({message})",
        location.shown,
        message,
    )


def _no_bucket(filesystem: Any, kind: str, bucket: str, source: str) -> bool:
    """Whether the store says that `bucket` does not exist (False when it will not say)."""
    if kind not in _BUCKETED or not bucket:
        return False
    try:
        return bool(filesystem.get_file_info(bucket).type == _arrow_fs(source).FileType.NotFound)
    except OSError:
        return False


def _bucket_missing(bucket: str, shown: str, source: str, message: str) -> StorageNotFound:
    return StorageNotFound(
        f"{source}: the bucket {bucket!r} of {shown!r} does not exist (or is not visible with "
        f"these credentials): check its name and the endpoint ({message})",
        shown,
        message,
    )


def store_of(
    names: Sequence[str | os.PathLike[str]],
    filesystem: Any,
    source: str,
    expand: bool = True,
    retries: RetryPolicy = DEFAULT_RETRIES,
) -> tuple[Store, list[Location]] | None:
    """The store and objects that `names` (with `filesystem=`) name, or None for local paths.

    Without a filesystem, URLs make one with pyarrow's `FileSystem.from_uri` (the first URL's
    query, e.g. `?endpoint_override=...&scheme=http`, sets its options); every URL must then
    name the same store. A glob is expanded in sorted order. The store retries its reads of
    records under `retries`.
    """
    if not isinstance(retries, RetryPolicy):
        raise ValueError(f"{source}: retries must be a loadax.RetryPolicy, got {retries!r}")
    urls = [is_url(name) for name in names]
    if filesystem is None and not any(urls):
        return None
    if filesystem is not None:
        store = Store.given(filesystem, source, retries)
        return store, store.locations([_text(name) for name in names], source, expand)
    if not all(urls):
        local = next(name for name, url in zip(names, urls, strict=True) if not url)
        raise ValueError(
            f"{source}: {str(local)!r} is a local path among URLs; read local files and objects "
            "in two datasets (ConcatenatedDataset joins them)"
        )
    texts = [_text(name) for name in names]
    first = _origin(texts[0])
    for text in texts[1:]:  # checked before anything is asked of a store
        if _origin(text) != first:
            raise ValueError(
                f"{source}: {_public(text)!r} names another store than {_public(texts[0])!r} "
                "(another scheme, credentials or options); one dataset reads from one store"
            )
    store = _store_from_url(texts[0], source, retries)
    return store, store.locations(texts, source, expand)


def _store_from_url(url: str, source: str, retries: RetryPolicy) -> Store:
    scheme, userinfo, query = _origin(url)
    kind = _KINDS.get(scheme)
    if kind is None:
        raise ValueError(
            f"{source}: cannot read {_public(url)!r}: URLs are read for the schemes "
            f"{', '.join(sorted(_KINDS))}; for another store pass its filesystem= (a "
            "pyarrow.fs.FileSystem or an fsspec filesystem) and paths in it"
        )
    fs = _arrow_fs(source)
    path = path_in_store(url)
    bucket = path.split("/", 1)[0]
    # The bucket's URL with the options: pyarrow parses no globs (and may ask for its region).
    made_of = (
        f"{scheme}://{userinfo + '@' if userinfo else ''}{bucket}{'?' if query else ''}{query}"
    )
    try:
        filesystem, _ = fs.FileSystem.from_uri(made_of)
    except OSError as error:  # e.g. the bucket's region could not be found
        shown = f"{_BUCKETED[kind]}://{path}"
        raise explained(error, Location(path, shown), source, kind) from None
    except ValueError as error:  # pyarrow's ArrowInvalid: options it does not know
        shown = f"{_BUCKETED[kind]}://{path}"
        raise ValueError(f"{source}: cannot make a filesystem for {shown!r}: {error}") from None
    return Store(filesystem, filesystem, retries)


def _origin(url: str) -> tuple[str, str, str]:
    """What decides the store of a URL: its scheme, credentials (`user:secret@`) and options
    (the query)."""
    scheme, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    query = url.split("?", 1)[1] if "?" in url else ""
    return scheme.lower(), authority.rpartition("@")[0], query


def path_in_store(name: str) -> str:
    """The path inside its store of the object `name` names: a URL less its scheme, its
    credentials (`user:secret@`) and its options (the query); a path as it is."""
    if not is_url(name):
        return name
    path = _URL.sub("", name, count=1).split("?", 1)[0]
    authority, slash, rest = path.partition("/")
    return authority.rpartition("@")[2] + slash + rest


def _public(url: str) -> str:
    """`url` as messages show it: without the credentials and options it may carry."""
    return f"{url.partition('://')[0]}://{path_in_store(url)}"


def _text(name: str | os.PathLike[str]) -> str:
    return name if isinstance(name, str) else os.fspath(name)


def _matches(parts: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[skip:], pattern[1:]) for skip in range(len(parts) + 1))
    return (
        bool(parts)
        and fnmatch.fnmatchcase(parts[0], pattern[0])
        and _matches(parts[1:], pattern[1:])
    )


def _forget(filesystem: Any) -> None:
    """A pyarrow filesystem has nothing to close: its connections go with it."""


def _arrow_fs(source: str) -> Any:
    """`pyarrow.fs`, or an ImportError that says how to install it."""
    try:
        import pyarrow.fs  # type: ignore[import-untyped]
    except ImportError as error:
        raise ImportError(
            f"{source} reads object stores and given filesystems with pyarrow, which is not "
            "installed: pip install 'loadax[s3]' (or 'loadax[gcs]')"
        ) from error
    return pyarrow.fs
