"""What `hvdazure data index` and `hvdazure data pack` do (the CLI parses, this runs): each returns the
one line the command prints. Bad input raises ValueError or FileNotFoundError with a one-line message."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hvdazure.data.index import ShardIndex, build_index, index_url


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE pairs (--storage-option) as fsspec storage options; a value that is JSON (true, 3) is
    parsed, any other value stays a string."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ValueError(f"--storage-option {pair!r}: give KEY=VALUE (e.g. account_name=myaccount)")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def index(source: str, output: str | None = None, *, progress: bool = True,
          storage_options: Sequence[str] = (), as_json: bool = False) -> str:
    """Index the shards of `source`; the summary line (or JSON)."""
    options = parse_storage_options(storage_options)
    built = build_index(source, output, progress=progress, storage_options=options)
    return summary(built, index_url(output or built.base), "indexed", as_json)


def pack(folder: str, output: str, format: str = "tar", shard_size: str | None = None, *,
         samples_per_shard: int | None = None, shuffle: bool = True, progress: bool = True,
         storage_options: Sequence[str] = (), as_json: bool = False) -> str:
    """Pack an ImageFolder-style folder into shards; the summary line (or JSON)."""
    from hvdazure.data.sizes import parse_size
    from hvdazure.data.writers import pack_folder

    size = parse_size(shard_size) if shard_size is not None else None  # a bad size, before any work
    packed = pack_folder(folder, output, format, size, samples_per_shard=samples_per_shard, shuffle=shuffle,
                         storage_options=parse_storage_options(storage_options), progress=progress)
    return summary(packed, index_url(packed.base), "packed", as_json)


def summary(index: ShardIndex, where: str, verb: str, as_json: bool) -> str:
    """One line: shards, samples, bytes and where the index is; or the same as JSON (with the fingerprint)."""
    if as_json:
        return json.dumps({"shards": len(index.shards), "samples": index.num_samples,
                           "bytes": index.num_bytes, "index": where, "fingerprint": index.fingerprint()})
    return (f"{verb} {len(index.shards)} shards, {index.num_samples} samples, {index.num_bytes} bytes "
            f"({_human(index.num_bytes)}); index: {where}")


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1000
    raise AssertionError("unreachable")
