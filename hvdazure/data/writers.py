"""Writing shards a ShardedDataset reads: `write_shards` from arrays, a map-style dataset or an iterable of
dict samples, and `pack_folder` from a folder of files in class subfolders (ImageFolder's layout).

Shards are named PREFIX-00000.EXT, ... and filled up to `shard_size` bytes (a shard holds at least one
sample) or `samples_per_shard` samples. Each is written to a temporary name and renamed into place (a
local directory) or uploaded whole (an object store); the index is written last, so a directory with an
index holds complete shards only. How each format stores a sample: formats/tar.py, tfrecord.py, parquet.py.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from hvdazure.core.object_store import filesystem
from hvdazure.data.formats import format_module
from hvdazure.data.index import (
    INDEX_NAME,
    ShardEntry,
    ShardIndex,
    is_shard_name,
    is_url,
    retrying_storage,
    without_file_scheme,
)
from hvdazure.data.shard_version import ShardVersion
from hvdazure.data.sizes import parse_size

DEFAULT_SHARD_SIZE = "64MB"
CLASSES_NAME = "classes.json"
EXTENSIONS = {"tar": ".tar", "tfrecord": ".tfrecord", "parquet": ".parquet"}


def write_shards(samples: Any, output: str, format: str = "tar", shard_size: str | int | None = None, *,
                 samples_per_shard: int | None = None, prefix: str = "shard",
                 storage_options: dict[str, Any] | None = None, progress: bool = True) -> ShardIndex:
    """Write samples into shards of `format` in `output` (a local directory or an fsspec URL, holding no
    shards yet) and index them; the ShardIndex written.

    `samples`: a dict (or tuple) of arrays sharing their first dimension, sample i being {name: a[i]}
    (a tuple's fields are named "0", "1", ...); a map-style dataset (`__len__` and `__getitem__`, e.g. a
    torch Dataset) or an iterable, each item a dict sample, a tuple (fields "0", "1", ...) or one value
    (field "0"). Tensors become NumPy arrays and integer scalars ints. Shards fill up to `shard_size`
    (default 64MB) or hold `samples_per_shard` samples, one or the other."""
    format_module(format)
    check_no_shards(output, storage_options)
    items: Iterable[dict[str, Any]] = _samples(samples)
    if progress:
        from tqdm import tqdm

        items = tqdm(items, total=_length(samples), unit="sample", desc="writing shards", dynamic_ncols=True)
    entries = write_shard_files(items, output, format, shard_size, samples_per_shard=samples_per_shard,
                                prefix=prefix, storage_options=storage_options)
    if not entries:
        raise ValueError("no samples to write")
    return write_index(output, entries, storage_options)


def check_no_shards(output: str, storage_options: dict[str, Any] | None = None) -> None:
    """A ValueError if `output` already holds shards or an index: shards are written into a new directory."""
    _Output(output, storage_options).check_no_shards()


def write_shard_files(samples: Iterable[dict[str, Any]], output: str, format: str = "tar",
                      shard_size: str | int | None = None, *, samples_per_shard: int | None = None,
                      prefix: str = "shard", storage_options: dict[str, Any] | None = None,
                      ) -> list[ShardEntry]:
    """The shards of dict `samples`, written in order as PREFIX-00000.EXT, ... into `output`, each whole
    (a temporary name, or one upload); what an index records of them. No index is written: `write_index`
    commits them (write_shards does both; ranks writing parts of one dataset call this each, and one of
    them writes the index)."""
    module = format_module(format)
    if shard_size is not None and samples_per_shard is not None:
        raise ValueError("give shard_size or samples_per_shard, not both")
    if samples_per_shard is not None and samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be at least 1, got {samples_per_shard}")
    limit = parse_size(shard_size or DEFAULT_SHARD_SIZE) if samples_per_shard is None else None
    target = _Output(output, storage_options)
    entries: list[ShardEntry] = []
    shard: _Shard | None = None
    try:
        for number, sample in enumerate(samples):
            payload, size = module.encode(sample, f"{number:09d}")
            if shard is not None and (shard.count == samples_per_shard or
                                      (limit is not None and shard.bytes + size > limit)):
                entries.append(shard.finish())
                shard = None
            if shard is None:
                shard = target.new_shard(f"{prefix}-{len(entries):05d}{EXTENSIONS[format]}", format)
            shard.add(payload, size)
        if shard is not None:
            entries.append(shard.finish())
            shard = None
    finally:
        if shard is not None:
            shard.abandon()
    return entries


def write_index(output: str, entries: Sequence[ShardEntry],
                storage_options: dict[str, Any] | None = None) -> ShardIndex:
    """Index `entries` (shards in `output`, in the order given) in `output`: the commit, written last."""
    base = _Output(output, storage_options).base
    index = ShardIndex(base, tuple(entries))
    index.save(base, storage_options)
    return index


def pack_folder(folder: str, output: str, format: str = "tar", shard_size: str | int | None = None, *,
                samples_per_shard: int | None = None, prefix: str = "shard", shuffle: bool = True,
                storage_options: dict[str, Any] | None = None, progress: bool = True) -> ShardIndex:
    """Pack a folder of files in class subfolders (FOLDER/CLASS/.../FILE, ImageFolder's layout) into
    shards: each file one sample {its extension: its bytes, "cls": its class's number}, the classes
    numbered in the order of their names (saved as classes.json next to the index). Files are written in
    an order shuffled with a fixed seed (`shuffle=False`: class by class), so that a shard holds many
    classes and the same folder gives the same shards."""
    files = _FolderSamples(folder, shuffle)
    format_module(format)  # an unknown format: refused before anything is written
    target = _Output(output, storage_options)
    target.check_no_shards()
    target.put(CLASSES_NAME, json.dumps(files.classes, indent=1).encode())  # before the index, the commit
    return write_shards(files, output, format, shard_size, samples_per_shard=samples_per_shard,
                        prefix=prefix, storage_options=storage_options, progress=progress)


class _FolderSamples:
    """The files of an ImageFolder-style folder as a map-style dataset of samples."""

    def __init__(self, folder: str, shuffle: bool) -> None:
        root = Path(folder).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"no such directory: {folder}")
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not self.classes:
            raise ValueError(f"{folder} has no class subfolders (the layout is {folder}/CLASS/FILE)")
        self.files = [(path, number) for number, name in enumerate(self.classes)
                      for path in _files_under(root / name)]
        if not self.files:
            raise ValueError(f"no files in the class subfolders of {folder}")
        for path, _ in self.files:
            if _extension(path) in ("cls", "__key__"):
                raise ValueError(f"{path}: a file's extension may not be {_extension(path)!r} (it names the "
                                 "class field)")
        self.extensions = sorted({_extension(path) for path, _ in self.files})
        if shuffle:
            order = np.random.default_rng(0).permutation(len(self.files))
            self.files = [self.files[i] for i in order]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        path, number = self.files[i]
        # every extension in every sample (None: left out of a tar or TFRecord sample, null in Parquet)
        sample: dict[str, Any] = dict.fromkeys(self.extensions)
        sample[_extension(path)] = path.read_bytes()
        sample["cls"] = number
        return sample


def _files_under(directory: Path) -> list[Path]:
    found = []
    for current, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(current) / name for name in sorted(names) if not name.startswith(".")]
    return found


def _extension(path: Path) -> str:
    return path.suffix[1:].lower() or "bin"


def _length(samples: Any) -> int | None:
    if isinstance(samples, Mapping):
        return len(next(iter(samples.values()))) if samples else 0
    if isinstance(samples, tuple) and samples and all(_is_column(column) for column in samples):
        return len(samples[0])
    try:
        return len(samples)
    except TypeError:
        return None


def _samples(samples: Any) -> Iterator[dict[str, Any]]:
    """Dict samples, from any of the inputs write_shards takes."""
    if isinstance(samples, Mapping) or (isinstance(samples, tuple) and samples
                                        and all(_is_column(column) for column in samples)):
        columns = dict(samples) if isinstance(samples, Mapping) else dict(enumerate(samples))
        columns = {str(name): column for name, column in columns.items()}
        for name, column in columns.items():
            if not _is_column(column):
                raise TypeError(f"field {name!r}: a dict of samples holds arrays (or lists) of one value a "
                                f"sample, not a {type(column).__name__}")
        lengths = {name: len(column) for name, column in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"the arrays' first dimensions differ: {lengths}")
        for i in range(next(iter(lengths.values()), 0)):
            yield {name: _value(column[i]) for name, column in columns.items()}
    elif hasattr(samples, "__len__") and hasattr(samples, "__getitem__") and not isinstance(samples, str):
        for i in range(len(samples)):
            yield _as_sample(samples[i])
    else:
        for item in samples:
            yield _as_sample(item)


def _is_column(value: Any) -> bool:
    return isinstance(value, list) or (hasattr(value, "__len__") and hasattr(value, "__getitem__")
                                       and len(getattr(value, "shape", ())) >= 1)


def _as_sample(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return {str(name): _value(value) for name, value in item.items()}
    if isinstance(item, tuple | list):
        return {str(i): _value(value) for i, value in enumerate(item)}
    return {"0": _value(item)}


def _value(value: Any) -> Any:
    """A NumPy array for a tensor (anything with __array__), an int for an integer scalar."""
    if not isinstance(value, np.ndarray | np.generic) and hasattr(value, "__array__"):
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.integer | np.bool_):
        return int(value)
    return value


class _Output:
    """The directory shards are written to: local (temporary name, then a rename) or an object store."""

    def __init__(self, output: str, storage_options: dict[str, Any] | None) -> None:
        output = without_file_scheme(output).rstrip("/")
        self.remote = is_url(output)
        self.storage_options = storage_options
        if self.remote:
            self.base = output
            self.fs, self.root = filesystem(output, storage_options)
        else:
            self.base = os.path.abspath(os.path.expanduser(output))

    def check_no_shards(self) -> None:
        if self.remote:
            found = retrying_storage(f"listing {self.base}", lambda: self.fs.find(self.root))
            names = [path[len(self.root):].lstrip("/") for path in found]
        elif os.path.isdir(self.base):
            names = os.listdir(self.base)
        else:
            names = []
        taken = sorted(name for name in names if is_shard_name(name) or name == INDEX_NAME)
        if taken:
            raise ValueError(f"{self.base} already holds shards ({', '.join(taken[:3])}"
                             f"{', ...' if len(taken) > 3 else ''}): write into a new directory")

    def new_shard(self, name: str, format: str) -> _Shard:
        return _Shard(self, name, format)

    def put(self, name: str, data: bytes) -> None:
        """A small file written whole (temporary name and rename when local)."""
        if self.remote:
            path = f"{self.root}/{name}"
            retrying_storage(f"writing {self.base}/{name}", lambda: self.fs.pipe_file(path, data))
            return
        os.makedirs(self.base, exist_ok=True)
        tmp = os.path.join(self.base, f".{name}.tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as file:
            file.write(data)
        os.replace(tmp, os.path.join(self.base, name))


class _Shard:
    """One shard being written: its format's Writer, the offsets so far, its size."""

    def __init__(self, output: _Output, name: str, format: str) -> None:
        self.output, self.name, self.format = output, name, format
        self.offsets: list[int] = []
        self.bytes = 0
        if output.remote:
            self.file: BinaryIO = io.BytesIO()
            self.tmp = ""
        else:
            os.makedirs(output.base, exist_ok=True)
            self.tmp = os.path.join(output.base, f".{name}.tmp-{uuid.uuid4().hex}")
            self.file = open(self.tmp, "wb")  # noqa: SIM115 -- closed by finish() or abandon()
        self.writer = format_module(format).Writer(self.file)

    @property
    def count(self) -> int:
        return len(self.offsets)

    def add(self, payload: Any, size: int) -> None:
        self.offsets.append(self.writer.add(payload, size))
        self.bytes += size

    def finish(self) -> ShardEntry:
        """Close the shard, put it in place, and say what the index records of it."""
        self.writer.close()
        output = self.output
        if output.remote:
            assert isinstance(self.file, io.BytesIO)
            data = self.file.getvalue()
            path = f"{output.root}/{self.name}"
            retrying_storage(f"writing {output.base}/{self.name}", lambda: output.fs.pipe_file(path, data))
            info = retrying_storage(f"reading the properties of {output.base}/{self.name}",
                             lambda: output.fs.info(path))
            size, version = len(data), ShardVersion.of_object(info)
        else:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            final = os.path.join(output.base, self.name)
            os.replace(self.tmp, final)
            stat = os.stat(final)
            size, version = stat.st_size, ShardVersion.of_stat(stat)
        return ShardEntry(self.name, self.format, self.count, size, version, np.asarray(self.offsets))

    def abandon(self) -> None:
        """Drop a shard a failure interrupted: no temporary file stays behind."""
        self.file.close()
        if self.tmp and os.path.exists(self.tmp):
            os.unlink(self.tmp)
