"""The index of a sharded dataset: for every shard, its format, samples, size, version and the offset
of each sample, so that any sample can be read without scanning, and a shard changed since indexing is
noticed.

`hvdazure-index.json` lies next to the shards (or where `build_index(..., output=)` puts it, which then
records the shards' directory as `base`). Shard paths are relative to the base, posix, sorted, so the same
shards give the same index. A shard's `version` (a ShardVersion, data/shard_version.py) is what says
"changed since indexing": the ETag on an object store, `f"{mtime_ns}:{size}"` for a file. Offsets are held
as int64 arrays, 8 bytes a sample.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdazure._version import __version__
from hvdazure.core.object_store import filesystem
from hvdazure.core.sample_plan import fingerprint as hash_of
from hvdazure.data.formats import FORMATS, SUFFIXES, format_for, scan_shard
from hvdazure.data.shard_version import ShardVersion, etag

INDEX_NAME = "hvdazure-index.json"
FORMAT_VERSION = 1
_GLOB_CHARS = "*?["
_REMOTE_THREADS = 8


@dataclass(frozen=True, eq=False)
class ShardEntry:
    """One shard of an index. Equal (and hashed) by everything but the offsets, which follow from it. The
    version may be given as the text an index records; it is held as a ShardVersion."""

    path: str             # relative to the index's base, posix ("train/shard-00003.tar")
    format: str           # "tar" | "tfrecord" | "parquet"
    num_samples: int
    bytes: int            # file size when indexed
    version: ShardVersion  # object store: the ETag; file: f"{mtime_ns}:{size}" (see ShardVersion)
    offsets: np.ndarray = field(repr=False)  # int64, one per sample (see formats/)

    def __post_init__(self) -> None:
        offsets = np.array(self.offsets, dtype=np.int64)
        offsets.flags.writeable = False
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "version", ShardVersion.parse(str(self.version)))
        if self.format not in FORMATS:
            raise ValueError(f"shard {self.path}: unknown format {self.format!r}")
        if len(offsets) != self.num_samples:
            raise ValueError(f"shard {self.path}: {len(offsets)} offsets for {self.num_samples} samples")

    def _identity(self) -> tuple[str, str, int, int, str]:
        return self.path, self.format, self.num_samples, self.bytes, str(self.version)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardEntry) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "num_samples": self.num_samples,
                "bytes": self.bytes, "version": str(self.version), "offsets": self.offsets.tolist()}


@dataclass(frozen=True)
class ShardIndex:
    """The shards of a dataset, in index order (global sample numbers run shard by shard in this order)."""

    base: str             # absolute path or URL of the directory the shards' paths are relative to
    shards: tuple[ShardEntry, ...]

    @property
    def num_samples(self) -> int:
        return sum(entry.num_samples for entry in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(entry.bytes for entry in self.shards)

    def url(self, entry: ShardEntry) -> str:
        """Where a shard is: the base joined with its path."""
        return f"{self.base.rstrip('/')}/{entry.path}"

    def fingerprint(self) -> str:
        """A short hash of the shards' paths, formats, sample counts, sizes and versions."""
        shards = [list(entry._identity()) for entry in self.shards]
        return hash_of({"index": FORMAT_VERSION, "shards": shards})

    def select(self, pattern: str) -> ShardIndex:
        """The shards whose path matches a glob (fnmatch: `*` also matches `/`), in index order."""
        chosen = tuple(entry for entry in self.shards if fnmatch.fnmatchcase(entry.path, pattern))
        if not chosen:
            raise ValueError(f"no shard of the index at {self.base} matches {pattern!r}")
        return ShardIndex(self.base, chosen)

    def to_json(self, base_recorded: bool = False) -> str:
        document: dict[str, Any] = {"format_version": FORMAT_VERSION, "created_by": f"hvdazure {__version__}"}
        if base_recorded:
            document["base"] = self.base
        document["shards"] = [entry.as_dict() for entry in self.shards]
        return json.dumps(document, separators=(",", ":"))

    def save(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        """Write the index as JSON to `url` (a file, or a directory to hold INDEX_NAME): a local file
        through a temporary name and a rename, an object in one upload. The base is recorded unless it is
        the index's own directory."""
        url = index_url(without_file_scheme(url))
        directory = _parent(url) if is_url(url) else os.path.dirname(os.path.abspath(url))
        base_recorded = directory != self.base.rstrip("/")
        data = self.to_json(base_recorded).encode()
        if is_url(url):
            fs, path = filesystem(url, storage_options)
            retrying_storage(f"writing {url}", lambda: fs.pipe_file(path, data))
            return
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(url)}.tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, url)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def index_url(url: str) -> str:
    """The index file a path or URL names: itself if it ends in .json, else INDEX_NAME inside it."""
    url = url.rstrip("/")
    return url if url.endswith(".json") else f"{url}/{INDEX_NAME}"


def load_index(url: str, storage_options: dict[str, Any] | None = None) -> ShardIndex:
    """The index at `url` (an index file, or a directory holding INDEX_NAME). FileNotFoundError naming it
    when there is none; ValueError for a file that is not an index."""
    url = index_url(without_file_scheme(url))
    try:
        if is_url(url):
            fs, path = filesystem(url, storage_options)
            text = retrying_storage(f"reading {url}", lambda: fs.cat_file(path)).decode()
        else:
            with open(url, encoding="utf-8") as file:
                text = file.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no index at {url} (make one with `hvdazure data index`)") from None
    return parse_index(text, _parent(url) if is_url(url) else os.path.dirname(os.path.abspath(url)), url)


def parse_index(text: str, directory: str, url: str) -> ShardIndex:
    """An index from its JSON text; `directory` is the base unless the JSON records one."""
    try:
        document = json.loads(text)
        if document.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {document.get('format_version')!r}, not {FORMAT_VERSION}")
        shards = tuple(ShardEntry(path=s["path"], format=s["format"], num_samples=int(s["num_samples"]),
                                  bytes=int(s["bytes"]), version=ShardVersion.parse(str(s["version"])),
                                  offsets=np.asarray(s["offsets"], dtype=np.int64))
                       for s in document["shards"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{url}: not an hvdazure index ({exc})") from None
    return ShardIndex(str(document.get("base", directory)), shards)


def build_index(source: str, output: str | None = None, *, progress: bool = True,
                storage_options: dict[str, Any] | None = None) -> ShardIndex:
    """Scan every shard of `source` (a local directory, a glob, a file, or an fsspec URL of any of them:
    abfs://container/dir, az://...) and write the index next to the shards, or to `output`."""
    source = without_file_scheme(source)
    shards, base, opener = _list_shards(source, storage_options)
    if not shards:
        raise ValueError(f"no shards ({', '.join(SUFFIXES)}) in {source}")
    names = [path[len(base):].lstrip("/") if is_url(source) else
             os.path.relpath(path, base).replace(os.sep, "/") for path, _ in shards]
    for name in names:
        format_for(name)  # a file a glob matched with another suffix: named, not skipped

    def scan(item: tuple[tuple[str, dict[str, Any]], str]) -> ShardEntry:
        (path, info), name = item
        fmt = format_for(name)
        display = _display(source, base, name)

        def read() -> np.ndarray:
            with opener(path) as file:
                return scan_shard(file, int(info["size"]), fmt, name=display)

        offsets = retrying_storage(f"indexing {display}", read) if is_url(source) else read()
        return ShardEntry(name, fmt, len(offsets), int(info["size"]), info["version"], offsets)

    threads = _REMOTE_THREADS if is_url(source) else min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads) as pool:
        results: Iterable[ShardEntry] = pool.map(scan, zip(shards, names, strict=True))
        if progress:
            from tqdm import tqdm

            results = tqdm(results, total=len(shards), unit="shard", desc="indexing", dynamic_ncols=True)
        entries = tuple(results)
    base_url = _base_url(source, base)
    index = ShardIndex(base_url, entries)
    index.save(output or base_url, storage_options)
    return index


def _list_shards(source: str, storage_options: dict[str, Any] | None
                 ) -> tuple[list[tuple[str, dict[str, Any]]], str, Callable[[str], Any]]:
    """(path, info with "size" and "version", a ShardVersion) of every shard of a source, sorted by path;
    the base directory; and how to open a path for reading."""
    if is_url(source):
        fs, root = filesystem(source, storage_options)
        root = root.rstrip("/")
        if any(char in root for char in _GLOB_CHARS):
            base = _glob_base(root)
            found = retrying_storage(f"listing {source}", lambda: fs.glob(root, detail=True))
            listed = {path: info for path, info in found.items() if info.get("type") != "directory"}
        elif retrying_storage(f"reading {source}", lambda: fs.isfile(root)):
            base, listed = posixpath.dirname(root), {root: fs.info(root)}
        else:
            base = root
            listed = retrying_storage(f"listing {source}", lambda: fs.find(root, detail=True))
            listed = {path: info for path, info in listed.items() if is_shard_name(path)}
        listed = {path: _with_version(fs, path, info) for path, info in listed.items()}
        return sorted(listed.items()), base, lambda path: fs.open(path, "rb")

    path = os.path.abspath(os.path.expanduser(source))
    if any(char in source for char in _GLOB_CHARS):
        import glob

        base = _glob_base(path)
        files = [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
    elif os.path.isfile(path):
        base, files = os.path.dirname(path), [path]
    elif os.path.isdir(path):
        base = path
        files = [os.path.join(directory, name) for directory, _, names in os.walk(path) for name in names
                 if is_shard_name(name)]
    else:
        raise FileNotFoundError(f"no such file or directory: {source}")
    return sorted((p, _local_info(p)) for p in files), base, lambda p: open(p, "rb")


def is_shard_name(path: str) -> bool:
    """Whether a file is a shard by its name: a known suffix, not hidden (temporary files are)."""
    name = posixpath.basename(path)
    return not name.startswith(".") and any(name.lower().endswith(suffix) for suffix in SUFFIXES)


def _glob_base(pattern: str) -> str:
    """The directory above a glob's first wildcard."""
    head = pattern[:min(pattern.find(c) for c in _GLOB_CHARS if c in pattern)]
    return head.rsplit("/", 1)[0] if "/" in head else ""


def _local_info(path: str) -> dict[str, Any]:
    stat = os.stat(path)
    return {"size": stat.st_size, "version": ShardVersion.of_stat(stat)}


def _with_version(fs: Any, path: str, info: dict[str, Any]) -> dict[str, Any]:
    """An object's info with its version (its properties are asked for when a listing lacks the ETag)."""
    if not etag(info):
        info = retrying_storage(f"reading the properties of {path}", lambda: fs.info(path))
    return {**info, "version": ShardVersion.of_object(info)}


def _display(source: str, base: str, name: str) -> str:
    return f"{_base_url(source, base).rstrip('/')}/{name}"


def _base_url(source: str, base: str) -> str:
    """The base directory as an absolute path, or as a URL with the source's protocol."""
    if not is_url(source):
        return base
    return f"{source.split('://', 1)[0]}://{base}"


def is_url(path: str) -> bool:
    """Whether a source or output is on an fsspec filesystem other than the local one."""
    return "://" in path and not path.startswith("file://")


def without_file_scheme(path: str) -> str:
    """A file:// URL as a local path; anything else as it is."""
    return path[len("file://"):] if path.startswith("file://") else path


def _parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def retrying_storage(what: str, call: Callable[[], Any]) -> Any:
    """An object store operation, retried on transient errors (core.object_store); ValueError (a corrupt
    shard) and FileNotFoundError pass as they are."""
    from hvdazure.core.object_store import retrying

    return retrying(what, call, passes=(ValueError,))
