"""A shard written to a local folder and indexed as the index builder indexes it: for the unit tests of the
shard cache and of local shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hvdazure.data.index import ShardEntry


def indexed_shard(directory: Path, name: str, data: bytes) -> ShardEntry:
    """Write a shard and index it as the index builder does (size, f"{mtime_ns}:{size}")."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    stat = path.stat()
    return ShardEntry(name, "tar", 1, stat.st_size, f"{stat.st_mtime_ns}:{stat.st_size}",
                      offsets=np.zeros(1, dtype=np.int64))
