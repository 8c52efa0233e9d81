"""Where a file source's files live when they are not local paths: objects in a store named by
URL (`s3://`, `gs://`) or in a filesystem the user gives (pyarrow's or fsspec's); reads retried
through outages; errors that say what to do (`loadax.sources.storage_errors`).

pyarrow, which reads the stores, is imported only when a URL or a filesystem is given, so that
`import loadax` never needs it.
"""

from __future__ import annotations

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
from loadax.sources.storage_errors import (
    BUCKETED,
    Location,
    arrow_fs,
    bucket_missing,
    explained,
    no_bucket,
)

R = TypeVar("R")

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_GLOB = re.compile(r"[*?[]")
_KINDS = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}  # a URL's scheme -> pyarrow's type_name


def is_url(path: object) -> bool:
    """Whether `path` is a str naming a store by URL (`s3://...`, `gs://...`)."""
    return isinstance(path, str) and _URL.match(path) is not None


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
        fs = arrow_fs(source)
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
        scheme = BUCKETED.get(self.kind)
        return f"{scheme}://{path}" if scheme is not None else path

    def kind_of(self, location: Location, source: str) -> str | None:
        """What is at `location`: "file", "directory", or None for nothing."""
        fs = arrow_fs(source)
        try:
            found = self.filesystem.get_file_info(location.path).type
        except OSError as error:
            raise self.explain(error, location, source) from None
        if found == fs.FileType.NotFound:
            bucket = location.path.split("/", 1)[0]
            if no_bucket(self.filesystem, self.kind, bucket, source):
                raise bucket_missing(bucket, location.shown, source, "no such bucket")
            return None
        return "directory" if found == fs.FileType.Directory else "file"

    def listing(self, location: Location, recursive: bool, source: str) -> list[tuple[str, bool]]:
        """The entries under the directory `location`, at any depth when `recursive`: each as
        its "/"-separated path relative to it, and whether it is a directory."""
        fs = arrow_fs(source)
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
        fs = arrow_fs(source)
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
        if not _GLOB.search(bucket) and no_bucket(self.filesystem, self.kind, bucket, source):
            return bucket_missing(bucket, shown, source, "no object matches")
        return FileNotFoundError(f"{source}: no object matches {shown!r}")

    def explain(self, error: OSError, location: Location, source: str) -> StorageError:
        """The error to raise for `error`, met reading `location`: what went wrong, and what
        to do about it."""
        return explained(error, location, source, self.kind, self.filesystem)


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
    fs = arrow_fs(source)
    path = path_in_store(url)
    bucket = path.split("/", 1)[0]
    # The bucket's URL with the options: pyarrow parses no globs (and may ask for its region).
    made_of = (
        f"{scheme}://{userinfo + '@' if userinfo else ''}{bucket}{'?' if query else ''}{query}"
    )
    try:
        filesystem, _ = fs.FileSystem.from_uri(made_of)
    except OSError as error:  # e.g. the bucket's region could not be found
        shown = f"{BUCKETED[kind]}://{path}"
        raise explained(error, Location(path, shown), source, kind) from None
    except ValueError as error:  # pyarrow's ArrowInvalid: options it does not know
        shown = f"{BUCKETED[kind]}://{path}"
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
