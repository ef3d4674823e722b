"""The shard formats: which format a file is (by its suffix), and one reader, scanner and default decode
per format behind one interface.

A format module (tar.py, tfrecord.py, parquet.py) has `scan(fileobj, size, name) -> offsets`, a `Reader`
class (`Reader(path, offsets, name)`, `.read(position)`, `.read_many(positions)`, `.close()`), `decode(raw)`
and `decode_columns(raws)`. Nothing here imports pyarrow or google_crc32c until a shard of that format is
opened or scanned.

Batches. `Reader.read_many` reads a micro-batch's samples of one shard at once: a run of consecutive
positions is one read of the bytes they span, split in bulk, with every check a single read makes.
`decode_columns(raws)` is the default decode of a whole micro-batch, by columns: a field whose values are
arrays of one dtype and shape is one stacked array (what stacking the decoded samples gives, bit for bit),
decoded straight into it where the format allows; any other field is the list of its decoded values.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
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

    def read_many(self, positions: Sequence[int], views: bool = False) -> list[Any]:
        """The raw samples at `positions` (ascending), what `read` gives each; `views`: a sample's byte
        strings may be memoryviews of one buffer (for decode_columns, which only reads them)."""
        ...

    def close(self) -> None: ...


Columns = dict[str, Any]  # field -> a stacked np.ndarray, or the list of the samples' values


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


def default_decode_columns(format: str) -> Callable[[list[Any]], Columns | None]:
    """The default decode of a micro-batch of raw samples, by columns (see the module's docstring); None
    when its decoded samples are not dicts of the same fields in the same order."""
    decode: Callable[[list[Any]], Columns | None] = format_module(format).decode_columns
    return decode


def columns_of(samples: list[Any]) -> Columns | None:
    """Decoded samples by columns: a field whose values are all arrays of one native dtype (not object or
    strings) and one shape, of one dimension or more, is np.stack of them; any other field the list of its
    values. None for samples that are not dicts with the same fields in the same order."""
    if not samples or not all(isinstance(sample, dict) for sample in samples):
        return None
    fields = list(samples[0])
    if any(list(sample) != fields for sample in samples[1:]):
        return None
    columns: Columns = {}
    for field in fields:
        values = [sample[field] for sample in samples]
        columns[field] = np.stack(values) if stackable(values) else values
    return columns


def stackable(values: list[Any]) -> bool:
    """Whether `values` are arrays of one native numeric or boolean dtype and one shape (ndim >= 1): what
    is stacked into one array, as torch's default_collate and np.stack would stack them."""
    first = values[0]
    if not isinstance(first, np.ndarray) or first.ndim == 0 or first.dtype.kind not in "biufc" or \
            not first.dtype.isnative:
        return False
    return all(isinstance(v, np.ndarray) and v.dtype == first.dtype and v.shape == first.shape
               for v in values)


def read_batch(format: str, requests: Sequence[tuple[ShardReader, Sequence[int]]],
               views: bool = False) -> list[list[Any]]:
    """A micro-batch's raw samples of one format, from several shards at once: per (reader, ascending
    positions) the samples `read_many` gives. A format whose checks are cheaper in bulk (tar's header
    checksums) does them once for the whole batch (its module's `read_batch`)."""
    batch = getattr(format_module(format), "read_batch", None)
    if batch is not None:
        raws: list[list[Any]] = batch(requests, views)
        return raws
    return [reader.read_many(positions, views) for reader, positions in requests]


def runs_of(positions: Sequence[int]) -> list[list[int]]:
    """Ascending positions cut into runs of consecutive ones (a position asked twice stays in its run)."""
    runs: list[list[int]] = []
    for position in positions:
        if runs and position - runs[-1][-1] in (0, 1):
            runs[-1].append(position)
        else:
            runs.append([position])
    return runs


def format_module(format: str) -> Any:
    """The module of a format (tar, tfrecord, parquet): its scan, Reader, decode, encode and Writer."""
    if format not in FORMATS:
        raise ValueError(f"unknown shard format {format!r} (known: {', '.join(FORMATS)})")
    return importlib.import_module(f"hvdazure.data.formats.{format}")
