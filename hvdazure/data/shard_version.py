"""A shard's version, what says "changed since indexing": one value for the index, writers and readers.

Three kinds, each recorded in the index as the text it has always had, so an index reads back unchanged:

- an object's ETag, as storage gives it (adlfs keeps its quotes: `"0x8DC1A2B3C4D5E6F"`);
- a local file's `f"{mtime_ns}:{size}"`;
- `f"size:{size}"`, for a store without ETags: no version at all, only the size.

The kind follows from the text (`parse`), so any text an index holds loads, and writes back byte for byte.
Two versions of one kind that differ say the shard changed; versions of two kinds (an index built on Blob,
read through an Azure ML mount: ETags against mtimes) or a size-only one cannot say, and leave the size to
decide (`matches`).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ShardVersion", "VersionKind", "etag", "normalize_etag"]

_FILE_VERSION = re.compile(r"\d+:\d+")  # f"{mtime_ns}:{size}"; anything else but "size:N" is an ETag
_SIZE_PREFIX = "size:"


class VersionKind(enum.Enum):
    """Where a version came from, which says what it can be compared with."""

    ETAG = "etag"  # an object store's ETag
    FILE = "file"  # a local file's mtime and size
    SIZE = "size"  # a store without ETags: the size alone


@dataclass(frozen=True)
class ShardVersion:
    """A shard's version as the index records it; `str()` is that text. Equal when the texts are: the
    kind-aware question "could these be the same shard?" is `matches`."""

    text: str  # exactly as the index records it (see the module's docstring)

    @classmethod
    def parse(cls, text: str) -> ShardVersion:
        """The version an index records as `text` (any kind; the kind follows from the text)."""
        return cls(text)

    @classmethod
    def of_etag(cls, etag: str) -> ShardVersion:
        """An object's version: its ETag, kept as storage gave it (quotes and all)."""
        version = cls(etag)
        if not etag or not version.is_etag:
            raise ValueError(f"{etag!r} is not an ETag the index can record (it would read back as another "
                             "kind of version)")
        return version

    @classmethod
    def of_file(cls, mtime_ns: int, size: int) -> ShardVersion:
        """A local file's version: its mtime (in nanoseconds) and size."""
        return cls(f"{int(mtime_ns)}:{int(size)}")

    @classmethod
    def of_stat(cls, stat: os.stat_result) -> ShardVersion:
        """A local file's version from its `os.stat`."""
        return cls.of_file(stat.st_mtime_ns, stat.st_size)

    @classmethod
    def of_size(cls, size: int) -> ShardVersion:
        """No version, only the size: for a store that gives no ETag."""
        return cls(f"{_SIZE_PREFIX}{size}")

    @classmethod
    def of_object(cls, info: Mapping[str, Any]) -> ShardVersion:
        """An object's version from an fsspec info dict: its ETag, or its size when the store gives none."""
        found = etag(info)
        return cls.of_etag(found) if found else cls.of_size(info["size"])

    @property
    def kind(self) -> VersionKind:
        if self.text.startswith(_SIZE_PREFIX):
            return VersionKind.SIZE
        if _FILE_VERSION.fullmatch(self.text):
            return VersionKind.FILE
        return VersionKind.ETAG

    @property
    def is_etag(self) -> bool:
        return self.kind is VersionKind.ETAG

    @property
    def is_file(self) -> bool:
        return self.kind is VersionKind.FILE

    @property
    def is_size_only(self) -> bool:
        return self.kind is VersionKind.SIZE

    @property
    def key(self) -> str:
        """The version without what clients differ in (an ETag's quotes, a weak ETag's W/): what two
        versions are compared by, and what a cached copy's name is made from."""
        return normalize_etag(self.text)

    def comparable(self, other: ShardVersion) -> bool:
        """Whether the two are of one kind (two ETags, or two file versions), so that differing says the
        shard changed; a size-only version is comparable with none."""
        return self.kind is other.kind and not self.is_size_only

    def matches(self, other: ShardVersion) -> bool:
        """Whether `other` may be this same version of the shard: False only when the two are comparable
        and differ (then the shard changed since indexing); otherwise only the size can tell."""
        return not self.comparable(other) or self.key == other.key

    def __str__(self) -> str:
        return self.text


def etag(info: Mapping[str, Any]) -> str | None:
    """The ETag in an fsspec info dict (adlfs: "etag"), as it is given; None without one."""
    value = info.get("etag") or info.get("ETag")
    return str(value) if value else None


def normalize_etag(etag: str) -> str:
    """An ETag without the quotes some clients keep around it (adlfs adds them, the REST API has them)."""
    return etag.strip().removeprefix("W/").strip('"')
