"""The shard files of a sharded dataset (tar, TFRecord): named by paths, URLs or globs, read by
byte ranges through each thread's own open files (a store's requests of one batch at once), and
their indexes cached on local disk."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import tempfile
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from loadax.sources.filesystems import Store, store_of
from loadax.sources.handles import HandlePool
from loadax.sources.paths import listed_paths
from loadax.sources.readahead import ReadAhead, joined
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy
from loadax.sources.storage_errors import Location

Index = dict[str, np.ndarray[Any, Any]]
"""A shard's index: named arrays, saved as a `.npz` (never a pickle)."""

log = logging.getLogger(__name__)

_FORMAT = 1  # the layout of a cached index: a new one ignores (and rebuilds) older files
_OPEN_FILES = 8  # open shards kept per reading thread
_CONCURRENT_READS = 16  # a batch's ranged requests to a store in flight at once
_SCAN_BUFFER = 1 << 20  # bytes read ahead when a shard is scanned for its index


def default_index_dir() -> Path:
    """Where indexes are cached unless `index_dir=` says: `$XDG_CACHE_HOME/loadax/indexes`
    (`~/.cache/loadax/indexes`)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "loadax" / "indexes"


class Shards:
    """The shard files of a dataset, in order: local files (paths or globs) or objects of a
    store (URLs, globs of them, or paths in a `filesystem`). Each reading thread reads byte
    ranges through its own open files (and its own copy of a store's filesystem)."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        filesystem: Any,
        retries: RetryPolicy,
        source: str,
    ) -> None:
        self.source = source
        listed = listed_paths(paths, source)
        found = store_of(listed, filesystem, source, retries=retries)
        self.store: Store | None = None if found is None else found[0]
        self.locations: tuple[Location, ...] = () if found is None else tuple(found[1])
        self.names: tuple[str, ...] = (
            tuple(_local_files(listed, source))
            if found is None
            else tuple(location.shown for location in self.locations)
        )
        self._files = HandlePool(partial(_ThreadFiles, self), _ThreadFiles.close)
        self._lock = threading.Lock()
        self._fetchers: _Fetchers | None = None  # a store's
        self.sizes: list[int] = []  # each shard's, once `fingerprints` has asked

    def fingerprints(self) -> list[tuple[int, int]]:
        """Each shard's size and modification time (ns): what its cached index was made for."""
        if self.store is None:
            stats = []
            for name in self.names:
                try:
                    found = os.stat(name)
                except OSError as error:
                    raise FileNotFoundError(
                        f"{self.source}: cannot read {name!r}: {error}"
                    ) from None
                stats.append((found.st_size, found.st_mtime_ns))
            self.sizes = [size for size, _ in stats]
            return stats
        infos = []
        for location in self.locations:
            try:
                info = self.store.filesystem.get_file_info(location.path)
            except OSError as error:
                raise self.store.explain(error, location, self.source) from None
            if not info.is_file:  # asked again to say what is there instead (or no bucket)
                if self.store.kind_of(location, self.source) == "directory":
                    raise IsADirectoryError(
                        f"{self.source}: {location.shown!r} is a prefix of objects; name its "
                        "shards, or a glob of them"
                    )
                raise FileNotFoundError(f"{self.source}: no object at {location.shown!r}")
            infos.append(info)
        self.sizes = [int(info.size) for info in infos]
        return [(int(info.size), int(info.mtime_ns or 0)) for info in infos]

    @contextmanager
    def scan(self, shard: int) -> Iterator[BinaryIO]:
        """Shard `shard` opened for one pass from its start (a local file can seek)."""
        if self.store is None:
            with open(self.names[shard], "rb") as file:
                yield file
            return
        location = self.locations[shard]
        try:
            stream = self.store.filesystem.open_input_stream(
                location.path, buffer_size=_SCAN_BUFFER
            )
        except OSError as error:
            raise self.store.explain(error, location, self.source) from None
        with stream:
            yield cast(BinaryIO, stream)

    def read_at(self, shard: int, offset: int, size: int) -> bytes:
        """`size` bytes of shard `shard` from `offset`: one ranged request from a store,
        retried through an outage; a short read names the shard and the offset."""
        if self.store is None:
            data = self._files.get().read_at(shard, offset, size)
        else:
            data = self.store.retried(
                lambda: self._files.get().read_at(shard, offset, size)  # this thread's files
            )
        if len(data) != size:
            raise ValueError(
                f"{self.source}: {self.names[shard]!r} ends at byte {offset + len(data)}, inside "
                f"the record at offset {offset}: the shard is truncated or changed since it "
                "was indexed"
            )
        return data

    def fetch(self, requests: Sequence[tuple[int, int, int]]) -> Iterator[tuple[int, bytes]]:
        """The bytes of each `(shard, offset, size)` of `requests`, as `read_at` reads them, with
        its position in `requests`: from local files one after the other; from a store as they
        arrive, up to 16 requests at a time (a shuffled batch is a request per record, and a
        store's latency is in each), a shard read in order read ahead (`ReadAhead`)."""
        if self.store is None:
            for position, request in enumerate(requests):
                yield position, self.read_at(*request)
            return
        fetchers = self._fetchers_here()
        fetch = partial(fetchers.submit, self.read_at)
        served = [fetchers.ahead.request(*request, fetch) for request in requests]
        direct = [position for position, blocks in enumerate(served) if blocks is None]
        if len(requests) == 1 and direct:  # nothing to wait for together
            yield 0, self.read_at(*requests[0])
            return
        waits: dict[Future[bytes], list[int]] = {}  # each fetch, the requests waiting on it
        missing = [0] * len(requests)  # of each request, the fetches it still waits on
        for position in direct:
            waits[fetch(*requests[position])] = [position]
            missing[position] = 1
        for position, blocks in enumerate(served):
            for block in blocks or ():
                waits.setdefault(block.data, []).append(position)
                missing[position] += 1
        for done in as_completed(waits):
            for position in waits[done]:
                missing[position] -= 1
                if missing[position] == 0:
                    blocks = served[position]
                    _, offset, size = requests[position]
                    yield (
                        position,
                        done.result() if blocks is None else joined(blocks, offset, size),
                    )

    def expect(self, spans: Sequence[tuple[int, int, int]]) -> None:
        """The byte spans `(shard, start, end)` of a store's shards that reads will soon ask
        for, in any order: fetched now in large reads, and held to serve them
        (`ReadAhead.expect`)."""
        fetchers = self._fetchers_here()
        fetchers.ahead.expect(spans, partial(fetchers.submit, self.read_at))

    def _fetchers_here(self) -> _Fetchers:
        """This process's fetching threads (a forked child cannot use its parent's)."""
        with self._lock:
            if self._fetchers is None or self._fetchers.pid != os.getpid():
                self._fetchers = _Fetchers(self.sizes, self.source)
            return self._fetchers

    def close(self) -> None:
        """Close every thread's open shards and end the fetching threads; later reads open
        and start them again."""
        with self._lock:
            fetchers, self._fetchers = self._fetchers, None
        if fetchers is not None and fetchers.pid == os.getpid():
            fetchers.close()
        self._files.close()

    def arguments(self) -> tuple[Any, ...]:
        """What makes these shards again (for pickling): the paths, globs expanded, and a
        store's filesystem by its options, and retries."""
        if self.store is None:
            return (list(self.names), None, DEFAULT_RETRIES)
        paths = [location.path for location in self.locations]
        return (paths, self.store.user_filesystem, self.store.retries)


class _Fetchers:
    """One process's threads that fetch a store's requests, started on the first, and what
    they read ahead."""

    def __init__(self, sizes: Sequence[int], source: str) -> None:
        self.pid, self.source = os.getpid(), source
        self.ahead = ReadAhead(sizes)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, read_at: Callable[[int, int, int], bytes], *request: int) -> Future[bytes]:
        with self._lock:
            if self._pool is None:
                prefix = f"{self.source}-fetch"
                self._pool = ThreadPoolExecutor(_CONCURRENT_READS, thread_name_prefix=prefix)
            return self._pool.submit(read_at, *request)

    def close(self) -> None:
        self.ahead.clear()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()


class _ThreadFiles:
    """One reading thread's open shards, least recently used first, and its filesystem."""

    def __init__(self, shards: Shards) -> None:
        self.shards = shards
        self.filesystem = None if shards.store is None else shards.store.copy()
        self.files: OrderedDict[int, Any] = OrderedDict()

    def read_at(self, shard: int, offset: int, size: int) -> bytes:
        file = self.files.get(shard)
        if file is None:
            file = self._open(shard)
            self.files[shard] = file
            if len(self.files) > _OPEN_FILES:
                self.files.popitem(last=False)[1].close()
        else:
            self.files.move_to_end(shard)
        if self.filesystem is None:
            return os.pread(file.fileno(), size, offset)
        store = cast(Store, self.shards.store)
        try:
            return bytes(file.read_at(size, offset))
        except OSError as error:
            raise store.explain(error, self.shards.locations[shard], self.shards.source) from None

    def _open(self, shard: int) -> Any:
        if self.filesystem is None:
            return open(self.shards.names[shard], "rb")
        store, location = cast(Store, self.shards.store), self.shards.locations[shard]
        try:
            return self.filesystem.open_input_file(location.path)
        except OSError as error:
            raise store.explain(error, location, self.shards.source) from None

    def close(self) -> None:
        while self.files:
            self.files.popitem()[1].close()

    def __del__(self) -> None:  # a dataset dropped unclosed: its threads' files go with it
        self.close()


class IndexCache:
    """Shard indexes saved as `.npz` files in `directory`, each with what it was made for (the
    shard's name, size and modification time); one that does not match, or does not load (a
    partial or damaged file: the zip's CRCs are checked), is built again. Files are written to a
    temporary name and renamed, so a reader never sees half of one."""

    def __init__(self, directory: str | os.PathLike[str] | None, kind: str, source: str) -> None:
        if directory is not None and not isinstance(directory, str | os.PathLike):
            raise ValueError(f"{source}: index_dir must be a path or None, got {directory!r}")
        self.directory = default_index_dir() if directory is None else Path(directory)
        self.kind, self.source = kind, source

    def path(self, name: str) -> Path:
        """The file caching the index of the shard `name` (its absolute path or URL)."""
        digest = hashlib.sha256(f"{self.kind}\0{name}".encode()).hexdigest()[:32]
        return self.directory / f"{digest}.{self.kind}.npz"

    def get(self, name: str, fingerprint: tuple[int, int], build: Callable[[], Index]) -> Index:
        """The index of shard `name` as it is now (`fingerprint`): cached, or built and saved."""
        meta = {"format": _FORMAT, "kind": self.kind, "name": name, "fingerprint": fingerprint}
        path = self.path(name)
        cached = self._load(path, meta)
        if cached is not None:
            return cached
        index = build()
        self._save(path, meta, index)
        return index

    def _load(self, path: Path, meta: dict[str, Any]) -> Index | None:
        try:
            with path.open("rb") as file, np.load(file, allow_pickle=False) as saved:
                found = {key: saved[key] for key in saved.files}
            stored = json.loads(str(found.pop("__meta__")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
            log.warning(
                "%s: the index %s does not load (%s); building it again", self.source, path, error
            )
            return None
        if stored != json.loads(json.dumps(meta)):
            log.info(
                "%s: the index %s is of another shard or version; building it again",
                self.source,
                path,
            )
            return None
        return found

    def _save(self, path: Path, meta: dict[str, Any], index: Index) -> None:
        temporary = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, suffix=".partial")
            with os.fdopen(descriptor, "wb") as file:
                arrays: dict[str, Any] = {"__meta__": np.array(json.dumps(meta)), **index}
                np.savez(file, **arrays)
            os.replace(temporary, path)
        except OSError as error:  # the index is still used, only not kept for next time
            log.warning("%s: cannot cache the index in %s: %s", self.source, self.directory, error)
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)


def _local_files(paths: Sequence[str | os.PathLike[str]], source: str) -> list[str]:
    """The absolute paths of the local files `paths` name, each glob's matches sorted."""
    found: list[str] = []
    for path in paths:
        text = os.fspath(path)
        if glob.has_magic(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"{source}: no file matches {text!r}")
        else:
            matches = [text]
        for match in matches:
            if os.path.isdir(match):
                raise IsADirectoryError(
                    f"{source}: {match!r} is a directory; name its shards (or a glob such as "
                    f"'{os.path.join(match, '*.tar')}')"
                )
            if not os.path.isfile(match):
                raise FileNotFoundError(f"{source}: no file at {match!r}")
            found.append(os.path.abspath(match))
    return found
