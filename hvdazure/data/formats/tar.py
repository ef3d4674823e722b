"""WebDataset-style tar shards: the regular files of a tar, grouped by key into samples, in file order.

A member `dir/abc.image.npy` has the key `dir/abc` (its path up to the first dot of its last component)
and the extension `image.npy` (the rest); consecutive members with one key are one sample, whose raw form
is `{"__key__": "dir/abc", "image.npy": b"...", ...}`. Members without an extension (and directories,
links) are skipped, as WebDataset skips them. A sample's offset is the byte offset of its first member's
header (of a long-name or pax header before it, if any), so a reader seeks straight to it.

The default decode turns `.npy` into an array (0-d ones into a NumPy scalar), `.cls` / `.index` into an
int, `.txt` into a str and `.json` into the parsed object, and names the result by the extension without
that suffix (`image.npy` -> `image`, `label.cls` -> `label`; `cls` stays `cls`); other extensions stay bytes.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from hvdazure.data.formats import Columns, runs_of, stackable
from hvdazure.data.formats.npy import load_npy, save_npy, stacked_npy
from hvdazure.data.formats.tar_header import BLOCK, ZERO_BLOCK, Unusual, bad_sums, number, regular_members


def _int(data: bytes) -> int:
    return int(data.decode().strip())


def _text(data: bytes) -> str:
    return data.decode()


def _npy_value(data: bytes) -> Any:
    array = load_npy(data)
    return array[()] if array.ndim == 0 else array


_DECODERS: dict[str, Callable[[bytes], Any]] = {"npy": _npy_value, "cls": _int, "index": _int, "txt": _text,
                                                "json": json.loads}


def split_name(member: str) -> tuple[str, str] | None:
    """(key, extension) of a member's path; None for a name with no extension."""
    directory, slash, base = member.rpartition("/")
    stem, dot, extension = base.partition(".")
    if not dot or not stem or not extension:
        return None
    return directory + slash + stem, extension


def scan(fileobj: BinaryIO, size: int, name: str) -> np.ndarray:
    """The offset of every sample's first member header; ValueError for a tar that is not one or is cut."""
    offsets: list[int] = []
    last_key: str | None = None
    archive = _open(fileobj, name)
    member: tarfile.TarInfo | None = None
    while True:
        try:
            member = archive.next()
        except (tarfile.TarError, OSError) as exc:
            if "unexpected end of data" in str(exc):  # a member's data runs past the end of the file
                raise ValueError(f"{name}: truncated: a member after byte {archive.offset} ends past the "
                                 f"end of the file ({size} bytes)") from None
            raise ValueError(f"{name}: unreadable tar header at byte {archive.offset} ({exc})") from None
        if member is None:
            break
        if member.offset_data + member.size > size:
            raise ValueError(f"{name}: truncated: member {member.name!r} ends at byte "
                             f"{member.offset_data + member.size}, the file has {size}")
        parts = split_name(member.name) if member.isfile() else None
        if parts is not None and parts[0] != last_key:
            offsets.append(member.offset)
            last_key = parts[0]
    _check_end(fileobj, archive.offset, size, name)
    return np.asarray(offsets, dtype=np.int64)


def _check_end(fileobj: BinaryIO, end: int, size: int, name: str) -> None:
    """A tar ends with a zero block: without one, the file was cut at a member's boundary."""
    fileobj.seek(end)
    block = fileobj.read(BLOCK)
    if len(block) < BLOCK or any(block):
        raise ValueError(f"{name}: truncated: no end-of-archive block at byte {end} (the file has {size})")


def _open(fileobj: BinaryIO, name: str) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=fileobj, mode="r:")
    except (tarfile.TarError, OSError) as exc:
        raise ValueError(f"{name}: not a readable tar file ({exc})") from None


class Reader:
    """Reads samples by position: one pread of the sample's bytes (its first header up to the next
    sample's), split into members by hand (`_split`); anything unusual is read with tarfile instead."""

    def __init__(self, path: str, offsets: np.ndarray, name: str) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDONLY)
        self._offsets = offsets
        self._name = name
        self._end: int | None = None  # where the last sample ends: the end-of-archive block (or EOF)
        self._file: BinaryIO | None = None  # for tarfile, opened on the first unusual sample

    def read(self, position: int) -> dict[str, Any]:
        start = int(self._offsets[position])
        stop = int(self._offsets[position + 1]) if position + 1 < len(self._offsets) else self._data_end()
        try:
            sample = _split(os.pread(self._fd, max(0, stop - start), start))
        except Unusual:
            return self._read_with_tarfile(position)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{self._name}: sample {position} (byte {start}) unreadable ({exc})") from None
        if not sample:
            raise ValueError(f"{self._name}: sample {position}: no member at byte {start}")
        return sample

    def read_many(self, positions: Sequence[int], views: bool = False) -> list[dict[str, Any]]:
        """The samples at `positions` (ascending), as `read` gives them (see `read_batch`)."""
        return read_batch([(self, positions)], views)[0]

    def _split_runs(self, positions: Sequence[int], views: bool, headers: list[bytes]) -> tuple[
            list[dict[str, Any]], list[int], list[int]]:
        """The samples at `positions`, each run of consecutive ones read in one pread and split by hand,
        their headers appended to `headers` unchecked; the samples, the sample of each header appended,
        and the samples to be read by `read` instead (unusual, cut or bad: read says what is wrong)."""
        out: list[dict[str, Any]] = []
        owners: list[int] = []
        again: list[int] = []
        for run in runs_of(positions):
            start = int(self._offsets[run[0]])
            stop = int(self._offsets[run[-1] + 1]) if run[-1] + 1 < len(self._offsets) else self._data_end()
            try:
                span = memoryview(os.pread(self._fd, max(0, stop - start), start))
            except OSError:
                span = memoryview(b"")
            for position in run:
                begin = int(self._offsets[position]) - start
                after = int(self._offsets[position + 1]) if position + 1 < len(self._offsets) else stop
                end = after - start
                mark = len(headers)
                try:
                    sample = _split(span[begin:end], headers) if end <= len(span) else {}
                except (Unusual, ValueError):
                    sample = {}
                if not sample:
                    again.append(len(out))
                    del headers[mark:]
                elif not views:
                    sample = {key: bytes(value) if isinstance(value, memoryview) else value
                              for key, value in sample.items()}
                owners += [len(out)] * (len(headers) - mark)
                out.append(sample)
        return out, owners, again

    def _data_end(self) -> int:
        """The byte after the last sample: the end-of-archive block, found by walking the headers from
        the last sample's (once per reader); the end of the file if the walk runs past it."""
        if self._end is None:
            position = int(self._offsets[-1])
            while True:
                header = os.pread(self._fd, BLOCK, position)
                if len(header) < BLOCK or header == ZERO_BLOCK:
                    break
                try:
                    size = number(header[124:136])
                except ValueError:
                    break  # the read reports it
                position += BLOCK + -(-size // BLOCK) * BLOCK
            self._end = min(position, os.fstat(self._fd).st_size)
        return self._end

    def _read_with_tarfile(self, position: int) -> dict[str, Any]:
        """A sample with members `_split` leaves to tarfile (GNU sparse files, global pax headers, ...)."""
        start = int(self._offsets[position])
        stop = int(self._offsets[position + 1]) if position + 1 < len(self._offsets) else None
        if self._file is None:
            self._file = open(self._path, "rb")  # noqa: SIM115 -- closed by close()
        self._file.seek(start)
        sample: dict[str, Any] = {}
        try:
            archive = tarfile.TarFile(fileobj=self._file, mode="r")
            member = archive.next()
            while member is not None and (stop is None or member.offset < stop):
                parts = split_name(member.name) if member.isfile() else None
                if parts is not None:
                    if sample and parts[0] != sample["__key__"]:
                        break
                    sample["__key__"] = parts[0]
                    data = archive.extractfile(member)
                    assert data is not None  # a regular file
                    sample[parts[1]] = data.read()
                member = archive.next()
        except (tarfile.TarError, OSError) as exc:
            raise ValueError(f"{self._name}: sample {position} (byte {start}) unreadable ({exc})") from None
        if not sample:
            raise ValueError(f"{self._name}: sample {position}: no member at byte {start}")
        return sample

    def close(self) -> None:
        os.close(self._fd)
        if self._file is not None:
            self._file.close()


def _split(data: bytes | memoryview, headers: list[bytes] | None = None) -> dict[str, Any]:
    """The sample in `data` (the bytes from its first header up to the next sample's): the regular
    members of its key (`regular_members`: as tarfile reads them, checksums checked), slices of `data`.
    ValueError for a bad or cut header or member; Unusual for the rest. `headers`: the checksums are left
    to the caller, each header appended to it."""
    sample: dict[str, Any] = {}
    for name, begin, size in regular_members(data, headers):
        parts = split_name(name)
        if parts is None:
            continue
        if sample and parts[0] != sample["__key__"]:
            break
        sample["__key__"] = parts[0]
        sample[parts[1]] = data[begin:begin + size]
    return sample


def read_batch(requests: Sequence[tuple[Reader, Sequence[int]]],
               views: bool = False) -> list[list[dict[str, Any]]]:
    """A micro-batch's samples, from several shards: per (reader, ascending positions), the samples, as
    `Reader.read` gives them. Each run of consecutive positions is one pread, split by hand; the header
    checksums of the whole batch are checked at once (a Python sum costs as much as reading 64 KB); a
    sample that is not plain or fails a check is read again by `Reader.read`, which reads it with tarfile
    or raises what is wrong with it. `views`: member bytes may be memoryviews of the read buffers."""
    headers: list[bytes] = []
    owners: list[tuple[int, int]] = []  # (request, sample) of each header
    out: list[list[dict[str, Any]]] = []
    again: list[tuple[int, int]] = []
    for r, (reader, positions) in enumerate(requests):
        samples, owned, redo = reader._split_runs(positions, views, headers)
        out.append(samples)
        owners += [(r, at) for at in owned]
        again += [(r, at) for at in redo]
    again += [owners[i] for i in bad_sums(headers)]
    for r, at in sorted(set(again)):
        reader, positions = requests[r]
        out[r][at] = reader.read(positions[at])
    return out


def decode(raw: dict[str, Any]) -> dict[str, Any]:
    """The default decode of a tar sample (see the module's docstring)."""
    out: dict[str, Any] = {}
    for extension, value in raw.items():
        out[_decoded_name(extension, raw)] = _decode_value(extension, value)
    return out


def decode_columns(raws: list[dict[str, Any]]) -> Columns | None:
    """The default decode of a micro-batch by columns (formats/__init__.py): `.npy` members of one header
    (one dtype and shape, C order, of one dimension or more) decoded into one stacked array, in one copy;
    every other member decoded as `decode` decodes it, as a list. None for samples whose members differ."""
    fields = list(raws[0]) if raws else []
    if not raws or any(list(raw) != fields for raw in raws[1:]):
        return None
    columns: Columns = {}
    for extension in fields:
        values = [raw[extension] for raw in raws]
        name = _decoded_name(extension, raws[0])
        stacked = stacked_npy(values) if extension.rpartition(".")[2] == "npy" else None
        if stacked is not None:
            columns[name] = stacked
            continue
        decoded = [_decode_value(extension, bytes(v) if isinstance(v, memoryview) else v) for v in values]
        columns[name] = np.stack(decoded) if stackable(decoded) else decoded
    return columns


def _decoded_name(extension: str, raw: dict[str, Any]) -> str:
    head, dot, last = extension.rpartition(".")
    if dot and last in _DECODERS and head not in raw:
        return head
    return extension


def _decode_value(extension: str, value: Any) -> Any:
    decoder = _DECODERS.get(extension.rpartition(".")[2])
    if decoder is None or not isinstance(value, bytes) or extension == "__key__":
        return value
    return decoder(value)


def encode(sample: Mapping[str, Any], key: str) -> tuple[list[tuple[str, bytes]], int]:
    """A sample as tar members `KEY.NAME[.TYPE]` (`__key__` in the sample replaces `key`), and the bytes
    they add to a shard: arrays and floats -> `.npy`, ints -> `.cls`, str -> `.txt`, dicts and lists ->
    `.json` (the type suffix left out when NAME already is or ends with it), bytes as they are, NAME the
    extension; None leaves the field out."""
    key = str(sample.get("__key__", key))
    if split_name(key + ".x") != (key, "x"):
        raise ValueError(f"sample key {key!r}: a tar key has no dot in its last path component")
    members = []
    for name, value in sample.items():
        if name != "__key__" and value is not None:
            extension, data = _encode_value(name, value)
            members.append((f"{key}.{extension}", data))
    size = sum(BLOCK + -(-len(data) // BLOCK) * BLOCK for _, data in members)
    return members, size


def _encode_value(name: str, value: Any) -> tuple[str, bytes]:
    if "/" in name or not name:
        raise ValueError(f"field {name!r}: a tar member's extension is not empty and has no '/'")
    if isinstance(value, bytes | bytearray | memoryview):
        return name, bytes(value)
    if isinstance(value, bool | int) and not isinstance(value, np.generic):
        return _with_type(name, "cls"), str(int(value)).encode()
    if isinstance(value, str):
        return _with_type(name, "txt"), value.encode()
    if isinstance(value, dict | list):
        return _with_type(name, "json"), json.dumps(value).encode()
    if isinstance(value, float | np.ndarray | np.generic):
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise TypeError(f"field {name!r}: an object array cannot be stored (give bytes or numbers)")
        return _with_type(name, "npy"), save_npy(array)
    raise TypeError(f"field {name!r}: cannot store a {type(value).__name__} in a tar shard "
                    "(bytes, str, int, float, NumPy arrays, dicts and lists can be)")


def _with_type(name: str, suffix: str) -> str:
    return name if name.rpartition(".")[2] == suffix else f"{name}.{suffix}"


class Writer:
    """Writes samples to one tar file (members of mode 0644 and mtime 0: the same samples, the same bytes)."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._archive = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def add(self, members: list[tuple[str, bytes]], size: int) -> int:
        """Write one sample's members; the offset of its first header."""
        offset = self._archive.offset
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            self._archive.addfile(info, io.BytesIO(data))
        return offset

    def close(self) -> None:
        self._archive.close()
