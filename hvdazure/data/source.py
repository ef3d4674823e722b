"""Where a sharded dataset's index and shards are, from the source string a user gives.

The forms of a source, and what each means:

- a local directory: its index is `hvdazure-index.json` in it;
- an index file (`*.json`), local or remote: the shards are where it says (by default its directory);
- a glob of shards (`data/train/shard-*.tar`): the index in the glob's directory, narrowed to the shards
  the glob matches (ShardIndex.select);
- an `abfs://container/dir` or `az://container/dir` URL (or any other fsspec URL): Azure Blob through
  adlfs, opened as checkpoints open it (core.object_store.filesystem), so the credentials are the same:
  AZURE_STORAGE_CONNECTION_STRING, else the account name (AZURE_STORAGE_ACCOUNT_NAME or the URL) with
  DefaultAzureCredential, which finds a managed identity on Azure ML;
- an Azure ML input path (`${{inputs.data}}`): a local directory, either downloaded (read in place) or
  mounted. A mount is a FUSE filesystem (blobfuse, Azure ML's data runtime) where every random read may be
  a request to storage, so it is treated like remote storage: whole shards are copied into the node's cache.

No rank builds a missing index: every rank fails with the same line saying to run `hvdazure data index`.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from hvdazure.core.object_store import filesystem, is_local
from hvdazure.data.index import INDEX_NAME, ShardIndex, load_index
from hvdazure.data.shard_version import ShardVersion

_GLOB_CHARS = re.compile(r"[*?\[]")
_MOUNTINFO = "/proc/self/mountinfo"


class MissingIndexError(FileNotFoundError):
    """A source has no index; the one-line message names where it was looked for and what to run."""


@dataclass(frozen=True)
class Source:
    """A resolved source: where its index is, and how its shards are read."""

    source: str  # as the user gave it
    index_url: str  # the index file: an absolute local path or a URL
    base: str  # the index's directory (the shards' base unless the index names another)
    fs: Any  # the fsspec filesystem of both
    needs_cache: bool  # remote storage or a FUSE mount: whole shards are copied to the node's cache
    pattern: str | None  # the glob the shards must match, relative to `base`; None: every shard

    def load_index(self, storage_options: dict[str, Any] | None = None) -> ShardIndex:
        """The index, narrowed to the glob's shards for a glob source. No index: MissingIndexError, the same
        line on every rank (none builds it: that takes a scan of every shard, `hvdazure data index`)."""
        try:
            index = load_index(self.index_url, storage_options)
        except FileNotFoundError:
            command = self.index_command()
            raise MissingIndexError(f"no index at {self.index_url}: run '{command}' first") from None
        return index.select(self.pattern) if self.pattern is not None else index

    def index_command(self) -> str:
        """The command that makes this source's index."""
        if self.index_url.endswith(INDEX_NAME):
            return f"hvdazure data index {self.base}"
        return f"hvdazure data index SHARDS --output {self.index_url}"


def resolve_source(source: str, storage_options: dict[str, Any] | None = None) -> Source:
    """Where `source`'s index and shards are (see the module's docstring); nothing is read but the local
    directory's existence."""
    if not source:
        raise ValueError("a dataset source must be a directory, an index file, a glob of shards or a URL")
    remote = "://" in source and not source.startswith("file://")
    location = source if remote else os.path.abspath(os.path.expanduser(source.removeprefix("file://")))
    directory, pattern = _split_glob(location)
    if pattern is None and location.endswith(".json"):
        index_url, directory = location, _parent(location)
    else:
        index_url = _join(directory, INDEX_NAME)
    fs, _ = filesystem(index_url, storage_options)
    local = is_local(fs)
    if local and not os.path.exists(directory):
        raise FileNotFoundError(f"dataset source {source}: no such file or directory")
    needs_cache = not local or is_fuse_mounted(directory)
    return Source(source, index_url, directory, fs, needs_cache, pattern)


def shard_version(fs: Any, path: str) -> tuple[int, ShardVersion]:
    """The size and version of a shard as it is in storage now: an object's ETag (its size, on a store
    without ETags), a file's mtime and size. What the index records per shard, and what readers check
    against it."""
    if is_local(fs):
        stat = os.stat(path)
        return stat.st_size, ShardVersion.of_stat(stat)
    fs.invalidate_cache()  # adlfs answers from its listings otherwise: another process may have replaced it
    info = fs.info(path)
    return int(info["size"]), ShardVersion.of_object(info)


def is_fuse_mounted(path: str, mountinfo: str | None = None) -> bool:
    """Whether `path` lies on a FUSE filesystem (blobfuse, Azure ML's mounts), from /proc/self/mountinfo
    (or the `mountinfo` text given): the longest mount point above the path decides."""
    if mountinfo is None:
        try:
            with open(_MOUNTINFO, encoding="utf-8", errors="replace") as file:
                mountinfo = file.read()
        except OSError:  # not Linux: no FUSE mounts we know of
            return False
    target = os.path.realpath(path) if os.path.exists(path) else os.path.abspath(path)
    best, fstype = "", ""
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not tail:
            continue
        point = _unescape(parts[4])
        if _is_under(target, point) and len(point) > len(best):
            best, fstype = point, tail.split()[0]
    return fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk"))


def _split_glob(location: str) -> tuple[str, str | None]:
    """(the directory above the first component with a glob character, the rest) or (location, None)."""
    if not _GLOB_CHARS.search(location):
        return location.rstrip("/") or location, None
    scheme, sep, rest = location.partition("://") if "://" in location else ("", "", location)
    parts = rest.split("/")
    first = next(i for i, part in enumerate(parts) if _GLOB_CHARS.search(part))
    if first == 0 or (sep and first == 1):
        raise ValueError(f"dataset source {location}: a glob needs a directory before its first wildcard")
    return scheme + sep + "/".join(parts[:first]), "/".join(parts[first:])


def _parent(location: str) -> str:
    return posixpath.dirname(location) if "://" in location else os.path.dirname(location)


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if "://" in directory else os.path.join(directory, name)


def _is_under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)

