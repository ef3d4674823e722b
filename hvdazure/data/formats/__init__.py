"""The shard formats: which format a file is (by its suffix), and one reader, scanner and default decode
per format behind one interface.

A format module (tar.py, tfrecord.py, parquet.py) has `scan(fileobj, size, name) -> offsets`, a `Reader`
class (`Reader(path, offsets, name)`, `.read(position)`, `.close()`) and `decode(raw)`. Nothing here imports
pyarrow or google_crc32c until a shard of that format is opened or scanned.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

if TYPE_CHECKING:
    from hvdazure.data.index import ShardEntry

FORMATS = ("tar", "tfrecord", "parquet")
SUFFIXES: dict[str, str] = {".tar": "tar", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord",
                            ".parquet": "parquet"}


class ShardReader(Protocol):
    """Reads the raw samples of one local shard file, by their position in the shard."""

    def read(self, position: int) -> Any:
        """The raw sample at offsets[position] of this shard."""
        ...

    def close(self) -> None: ...


def format_for(path: str) -> str:
    """The format of a shard file, by its suffix; ValueError naming the file for any other suffix."""
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix, fmt in SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise ValueError(f"{path}: not a shard (known suffixes: {', '.join(SUFFIXES)})")


def open_shard(local_path: str, entry: ShardEntry) -> ShardReader:
    """A reader of the local file `local_path`, which holds the shard `entry` of an index."""
    name = local_path if local_path.endswith(entry.path) else f"{entry.path} (at {local_path})"
    reader: ShardReader = format_module(entry.format).Reader(local_path, entry.offsets, name)
    return reader


def scan_shard(fileobj: BinaryIO, size: int, format: str, name: str = "shard") -> np.ndarray:
    """The offsets of every sample of a shard of `size` bytes read from `fileobj` (int64, one a sample);
    ValueError naming `name` and the record for a corrupt or truncated shard."""
    offsets: np.ndarray = format_module(format).scan(fileobj, size, name)
    return offsets


def default_decode(format: str) -> Callable[[Any], Any]:
    """The decode a ShardedDataset uses when it is given none: raw sample -> arrays, ints, strings."""
    decode: Callable[[Any], Any] = format_module(format).decode
    return decode


def format_module(format: str) -> Any:
    """The module of a format (tar, tfrecord, parquet): its scan, Reader, decode, encode and Writer."""
    if format not in FORMATS:
        raise ValueError(f"unknown shard format {format!r} (known: {', '.join(FORMATS)})")
    return importlib.import_module(f"hvdazure.data.formats.{format}")
