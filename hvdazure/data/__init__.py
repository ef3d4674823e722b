"""Sharded datasets bigger than memory: shard formats (WebDataset tar, TFRecord, Parquet), their index,
the tools that write shards, and ShardedDataset, which the trainers read them through.

The names below are imported on first use (PEP 562), so `import hvdazure.data` costs almost nothing
and loads neither pyarrow nor fsspec.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hvdazure.data.formats.tf_example import parse_example
    from hvdazure.data.index import ShardEntry, ShardIndex, build_index, load_index
    from hvdazure.data.shard_version import ShardVersion
    from hvdazure.data.writers import pack_folder, write_shards

_EXPORTS = {
    "ShardedDataset": "hvdazure.data.dataset",
    "ShardEntry": "hvdazure.data.index",
    "ShardIndex": "hvdazure.data.index",
    "ShardVersion": "hvdazure.data.shard_version",
    "build_index": "hvdazure.data.index",
    "load_index": "hvdazure.data.index",
    "parse_example": "hvdazure.data.formats.tf_example",
    "write_shards": "hvdazure.data.writers",
    "pack_folder": "hvdazure.data.writers",
}
__all__ = ["ShardEntry", "ShardIndex", "ShardVersion", "ShardedDataset", "build_index", "load_index",
           "pack_folder", "parse_example", "write_shards"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hvdazure.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
