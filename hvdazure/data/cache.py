"""Local files for a dataset's shards: read in place from a local disk, or cached whole from remote storage.

`open_shards(index)` chooses. Shards on a local disk (an Azure ML download included) are read where they are
(`LocalShards`): nothing is copied, and each shard's size and mtime are checked against the index first.
Shards in an object store (abfs://, az://) or on a FUSE mount (Azure ML's mount mode, blobfuse, where every
random read may be a request to storage) are copied whole into a node-local cache (`ShardCache`), by this
policy:

- One file per (base, shard path, shard version) under the cache directory, so a re-indexed dataset never
  reads an older copy. A download goes to a temporary name and is renamed into place only after its size
  and the version it was downloaded at (the object's ETag, a file's mtime and size) match the index: a file
  under its final name is complete and right. A temporary file left by a killed process is never read, and
  the next download of that shard deletes it. (An index whose versions are of the other kind, e.g. built on
  Blob and read through an Azure ML mount, ETags against mtimes, is checked by size alone.)
- One download per shard per node: every process (ranks, DataLoader workers) takes the shard's lock file
  (fcntl) before downloading and looks again once it holds it, so the others wait and then find the file.
  A forked child closes the lock files its parent held at the fork (`_close_inherited_locks`): an flock
  belongs to the open file and every copy of it, so a copy the child kept would hold the shard's lock for
  the child's life, and the child itself (a DataLoader worker forked while a read-ahead thread downloads
  the shard it is about to read), or any process of the node, would wait for that shard forever.
- Transient storage errors (429, 5xx, timeouts, resets, a body cut short) are retried with bounded backoff
  (hvdazure.core.object_store.retrying). A shard that is missing, of another size or changed since
  indexing is a ShardError: one line naming the shard's URL, raised on every rank that needs it.
- `prefetch(entries)` replaces the read-ahead queue: a few threads download its shards in order.
- With a size limit, the least recently used shards are deleted once the cache is over it, never one in
  this process's read-ahead queue, being downloaded, or among the last handed out. Deleting a file another
  process has open is harmless on Linux (its reader keeps the data until it closes it).
- A shard streams to disk in chunks, so memory does not grow with shard or dataset size.
- A ShardCache pickles (for DataLoader workers) without its threads and locks, and a forked copy starts
  afresh likewise; a worker's copy downloads on demand through the same lock files, and counts its own
  downloads in `stats`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import posixpath
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hvdazure.core.object_store import filesystem, is_local, retrying
from hvdazure.core.rank_logging import logger
from hvdazure.data.shard_version import ShardVersion
from hvdazure.data.sizes import parse_size
from hvdazure.data.source import is_fuse_mounted, shard_version

if TYPE_CHECKING:
    from hvdazure.data.index import ShardEntry, ShardIndex

__all__ = ["CacheStats", "LocalShards", "ShardCache", "ShardError", "Shards", "open_shards"]

_CHUNK = 8 << 20  # bytes per range request and per write: one buffer of this size per download
_TOUCH_EVERY = 1.0  # seconds between two mtime updates (the LRU clock) of one cached shard by one process
_RECENT = 2  # the shards last handed out, which eviction keeps: the one being read and the one before
_REINDEX = "run 'hvdazure data index' again"


class ShardError(RuntimeError):
    """A shard is missing, truncated or changed since indexing; the one-line message names its URL."""


class Shards(Protocol):
    """Local files for an index's shards (what ShardedDataset reads through)."""

    def local_path(self, entry: ShardEntry) -> str:
        """A verified local file holding the shard; blocks until it is there."""
        ...

    def prefetch(self, entries: Sequence[ShardEntry]) -> None:
        """Replace the read-ahead queue with `entries`, fetched in order in the background."""
        ...

    def close(self) -> None:
        """Stop reading ahead."""
        ...


@dataclass
class CacheStats:
    """What one process's ShardCache did: shards and bytes it downloaded, and shards found already there."""

    downloads: int = 0
    downloaded_bytes: int = 0
    hits: int = 0


def open_shards(index: ShardIndex, cache: str | bool | None = "auto", cache_dir: str | None = None,
                limit_bytes: int | str | None = None,
                storage_options: dict[str, Any] | None = None) -> Shards:
    """Local files for `index`'s shards. cache="auto" (or None): a ShardCache for remote storage and FUSE
    mounts, the files in place otherwise; True: always a ShardCache; False: in place (local disks only).
    `cache_dir` defaults to hvdazure.core.environments.default_cache_dir() (HVDAZURE_CACHE_DIR wins)."""
    if cache not in ("auto", None, True, False):
        raise ValueError(f"cache must be 'auto', True or False, got {cache!r}")
    base = index.base
    fs, root = filesystem(base, storage_options)
    local = is_local(fs)
    if cache is False and not local:
        raise ValueError(f"cache=False reads shards in place, which needs a local directory; {base} is "
                         "remote storage (use cache='auto')")
    if cache is False or (cache is not True and local and not is_fuse_mounted(root)):
        return LocalShards(root)
    if cache_dir is None:
        from hvdazure.core.environments import default_cache_dir

        cache_dir = default_cache_dir()
    limit = None if limit_bytes is None else parse_size(limit_bytes, "the cache size limit")
    return ShardCache(base, cache_dir, limit, storage_options)


class LocalShards:
    """Shards read where they are, on a local (non-FUSE) disk: checked against the index, never copied."""

    def __init__(self, base: str) -> None:
        self.base = base.removeprefix("file://")
        self._checked: set[str] = set()

    def local_path(self, entry: ShardEntry) -> str:
        path = os.path.join(self.base, *_parts(entry.path))
        if path not in self._checked:  # a stat per shard per process, not per sample
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                raise ShardError(f"shard {path} is missing ({_REINDEX} if the dataset changed)") from None
            _check(path, entry, stat.st_size, ShardVersion.of_stat(stat))
            self._checked.add(path)
        return path

    def prefetch(self, entries: Sequence[ShardEntry]) -> None:
        """Nothing to fetch: the files are on this disk."""

    def close(self) -> None:
        pass


class ShardCache:
    """Whole shards of remote storage or a FUSE mount, copied once per node into `cache_dir` (see the
    module's docstring for the rules)."""

    _fs: Any  # the fsspec filesystem of `base`, made on first use (and again in each unpickled copy)
    _root: str
    _queue: deque[ShardEntry]  # the read-ahead queue
    _in_flight: set[str]  # cached files this process's prefetch threads are fetching
    _recent: deque[str]  # the last cached files local_path handed out
    _threads: list[threading.Thread]
    _touched: dict[str, float]  # cached file -> when this process last set its mtime (the LRU clock)
    _pid: int  # the process the threads and locks belong to

    def __init__(self, base: str, cache_dir: str, limit_bytes: int | None = None,
                 storage_options: dict[str, Any] | None = None, prefetch_threads: int = 4) -> None:
        if prefetch_threads < 1:
            raise ValueError(f"prefetch_threads must be at least 1, got {prefetch_threads}")
        self.base = base.rstrip("/")
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
        self.limit_bytes = limit_bytes
        self.storage_options = dict(storage_options or {})
        self.prefetch_threads = prefetch_threads
        self.stats = CacheStats()
        self._directory = os.path.join(self.cache_dir, _slug(self.base))
        self._start_fresh()

    # --- the Shards protocol ----------------------------------------------------------------------------
    def local_path(self, entry: ShardEntry) -> str:
        self._own()
        final = self._final(entry)
        with self._lock:
            self._recent.append(final)
        if self._is_cached(final, entry) or not self._fetch(entry, final):
            with self._lock:
                self.stats.hits += 1
        else:
            self._evict()
        return final

    def prefetch(self, entries: Sequence[ShardEntry]) -> None:
        self._own()
        with self._lock:
            if self._closed:
                return
            self._queue = deque(entries)
            while len(self._threads) < self.prefetch_threads:
                thread = threading.Thread(target=self._read_ahead, name="hvdazure-prefetch", daemon=True)
                thread.start()
                self._threads.append(thread)
            self._wake.notify_all()

    def close(self) -> None:
        """Empty the read-ahead queue and wait for the downloads under way (bounded by their retries)."""
        self._own()
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._wake.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()

    def is_cached(self, entry: ShardEntry) -> bool:
        """Whether the shard is in the cache now, complete and verified (by this process or another)."""
        self._own()
        return self._is_cached(self._final(entry), entry)

    def url(self, entry: ShardEntry) -> str:
        """Where the shard is in storage (what errors name)."""
        return f"{self.base}/{entry.path}"

    # --- pickling: no threads, locks or filesystem objects cross into a DataLoader worker -----------------
    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name in _PICKLED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stats = CacheStats()
        self._start_fresh()

    def _own(self) -> None:
        """In a process forked from the one that made this cache (a DataLoader worker started by fork), start
        afresh: the parent's threads do not run here, and a lock one of them held would stay held."""
        if self._pid != os.getpid():
            self.stats = CacheStats()
            self._start_fresh()

    def _start_fresh(self) -> None:
        self._pid = os.getpid()
        self._fs = None
        self._root = ""
        self._lock = threading.Lock()  # guards the queue, the stats and the sets below
        self._wake = threading.Condition(self._lock)
        self._queue = deque()
        self._in_flight = set()
        self._recent = deque(maxlen=_RECENT)
        self._threads = []
        self._closed = False
        self._touched = {}

    # --- one shard -----------------------------------------------------------------------------------------
    def _final(self, entry: ShardEntry) -> str:
        """This version of the shard's file: <cache_dir>/<base>/<dirs>/<stem>.<version><suffix>."""
        *dirs, name = _parts(entry.path)
        stem, suffix = os.path.splitext(name)
        version = hashlib.sha256(entry.version.key.encode()).hexdigest()[:12]
        return os.path.join(self._directory, *dirs, f"{stem}.{version}{suffix}")

    def _is_cached(self, final: str, entry: ShardEntry) -> bool:
        """Whether the shard is in the cache under its final name; marks it as just used (the LRU clock)."""
        now = time.monotonic()
        if now - self._touched.get(final, -_TOUCH_EVERY) < _TOUCH_EVERY:
            return True
        try:
            if os.stat(final).st_size != entry.bytes:  # a copy damaged after the fact: downloaded again
                return False
            os.utime(final)
        except FileNotFoundError:  # never there, or evicted by another process
            self._touched.pop(final, None)
            return False
        self._touched[final] = now
        return True

    def _fetch(self, entry: ShardEntry, final: str) -> bool:
        """Download the shard to `final` unless another process or thread did while this one waited for
        its lock; whether this call downloaded it."""
        os.makedirs(os.path.dirname(final), exist_ok=True)
        with _locked(final + ".lock"):
            if self._is_cached(final, entry):
                return False
            for stale in glob.glob(glob.escape(final) + ".tmp-*"):  # a killed download's: the lock is ours
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
            url = self.url(entry)
            temporary = f"{final}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                size = retrying(f"downloading {url}", lambda: self._download(entry, temporary),
                                passes=(ShardError,))
                os.replace(temporary, final)
            except FileNotFoundError:
                raise ShardError(f"shard {url} is missing ({_REINDEX} if the dataset changed)") from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
            self._touched[final] = time.monotonic()
        with self._lock:
            self.stats.downloads += 1
            self.stats.downloaded_bytes += size
        return True

    def _download(self, entry: ShardEntry, temporary: str) -> int:
        """One attempt: check the shard's size and version in storage, stream it into `temporary` in chunks,
        and check that it did not change while it was read. Returns the bytes written."""
        fs, path, url = *self._filesystem(entry), self.url(entry)
        size, version = shard_version(fs, path)
        _check(url, entry, size, version)
        written = 0
        with open(temporary, "wb") as sink:
            if is_local(fs):
                with open(path, "rb") as source:
                    buffer = bytearray(_CHUNK)
                    while count := source.readinto(buffer):
                        sink.write(memoryview(buffer)[:count])
                        written += count
            else:
                while written < size:
                    chunk = fs.cat_file(path, start=written, end=min(written + _CHUNK, size))
                    if not chunk:
                        break
                    sink.write(chunk)
                    written += len(chunk)
        if written != size:
            raise IncompleteDownload(f"{url}: got {written} of its {size} bytes")
        if shard_version(fs, path) != (size, version):
            raise ShardError(f"shard {url} changed while it was downloaded ({_REINDEX})")
        return written

    def _filesystem(self, entry: ShardEntry) -> tuple[Any, str]:
        with self._lock:
            if self._fs is None:
                self._fs, self._root = filesystem(self.base, self.storage_options)
            fs, root = self._fs, self._root
        if is_local(fs):
            return fs, os.path.join(root, *_parts(entry.path))
        return fs, posixpath.join(root, entry.path)

    # --- read-ahead and eviction ---------------------------------------------------------------------------
    def _read_ahead(self) -> None:
        """A prefetch thread: the queue's shards, first first, until close(). Failures are left for
        local_path to raise, on the rank that needs the shard."""
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                entry = self._queue.popleft()
                final = self._final(entry)
                if final in self._in_flight:
                    continue
                self._in_flight.add(final)
            try:
                if not self._is_cached(final, entry) and self._fetch(entry, final):
                    self._evict()
            except Exception as exc:  # local_path raises it, where the shard is needed
                logger.debug(f"prefetching {self.url(entry)}: {exc}")
            finally:
                with self._lock:
                    self._in_flight.discard(final)

    def _evict(self) -> None:
        """Delete least recently used shards (oldest mtime first) while the cache is over its limit."""
        if self.limit_bytes is None:
            return
        with self._lock:
            keep = {self._final(entry) for entry in self._queue} | self._in_flight | set(self._recent)
        cached, total = [], 0
        for folder, _, names in os.walk(self.cache_dir):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                total += stat.st_size  # downloads under way take room too, though they cannot be evicted
                if not name.endswith(".lock") and ".tmp-" not in name:
                    cached.append((stat.st_mtime_ns, stat.st_size, path))
        for _, size, path in sorted(cached):
            if total <= self.limit_bytes:
                break
            if path in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                total -= size
            self._touched.pop(path, None)


class IncompleteDownload(ConnectionError):
    """A shard's body ended early: transient (retried), as a dropped connection is."""


_PICKLED = ("base", "cache_dir", "limit_bytes", "storage_options", "prefetch_threads", "_directory")


def _check(url: str, entry: ShardEntry, size: int, version: ShardVersion) -> None:
    """ShardError unless a shard's size and version in storage are those the index recorded. Versions of
    two kinds (an index built on Blob read through a mount or download, ETags against mtimes, or one built
    on files that were then uploaded) or a size-only one leave the size alone to go by
    (ShardVersion.matches)."""
    if size != entry.bytes:
        raise ShardError(f"shard {url} has {size} bytes, the index says {entry.bytes} (truncated, or changed "
                         f"since indexing: {_REINDEX})")
    if not entry.version.matches(version):
        raise ShardError(f"shard {url} changed since indexing ({_REINDEX})")


def _parts(path: str) -> list[str]:
    """The components of an index's relative posix path; ValueError for one that leaves its base."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts or path.startswith("/"):
        raise ValueError(f"shard path {path!r} must be relative to the index's base, without '..'")
    return parts


def _slug(base: str) -> str:
    """A directory name for a base: readable, and unique by its hash (abfs-data-train-3f9c2a71d0)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")[-60:]
    return f"{readable}-{hashlib.sha256(base.encode()).hexdigest()[:10]}"


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock on `path` across processes and threads (each call opens its own description).
    The kernel releases it when its holder dies, so a killed download never blocks the others."""
    with _lock_files_guard:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        _lock_files.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with _lock_files_guard:
            _lock_files.discard(fd)
            os.close(fd)


_lock_files: set[int] = set()  # this process's open lock files (descriptors), held or waited for
_lock_files_guard = threading.Lock()  # held across a fork: no descriptor is opened or closed unrecorded


def _close_inherited_locks() -> None:
    """In a forked child: close its copies of the lock files its parent had open (see the module's
    docstring: a copy kept would hold the parent's lock for the child's life)."""
    global _lock_files_guard
    for fd in _lock_files:
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_files.clear()
    _lock_files_guard = threading.Lock()  # the parent's was held by the forking thread


os.register_at_fork(before=lambda: _lock_files_guard.acquire(),
                    after_in_parent=lambda: _lock_files_guard.release(),
                    after_in_child=_close_inherited_locks)
