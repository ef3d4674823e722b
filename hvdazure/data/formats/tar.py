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
import math
import os
import struct
import tarfile
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np

_BLOCK = tarfile.BLOCKSIZE


def _int(data: bytes) -> int:
    return int(data.decode().strip())


def _text(data: bytes) -> str:
    return data.decode()


def _load_npy(data: bytes) -> Any:
    array = load_npy(data)
    return array[()] if array.ndim == 0 else array


_NPY_MAGIC = b"\x93NUMPY"
_npy_headers: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}  # header bytes -> parsed


def load_npy(data: bytes) -> np.ndarray:
    """What `np.load(io.BytesIO(data), allow_pickle=False)` gives (a writeable array, C or Fortran order),
    its header parsed once per distinct header (np.load from a BytesIO costs ~0.2 ms a call); anything
    np.load would refuse or treat specially (object dtypes, short data, format 3.0) goes to np.load."""
    if data[:6] == _NPY_MAGIC and data[6] in (1, 2):
        start = 10 if data[6] == 1 else 12
        header = data[:start + int.from_bytes(data[8:start], "little")]
        parsed = _npy_headers.get(header)
        if parsed is None:
            parsed = _npy_header(header)
        if parsed is not None:
            dtype, shape, fortran = parsed
            count = math.prod(shape)
            if len(data) - len(header) >= count * dtype.itemsize:
                flat = np.frombuffer(data, dtype, count, len(header))
                array = flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
                return array.copy(order="K")  # writeable, as np.load's
    loaded: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    return loaded


def _npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool] | None:
    """(dtype, shape, fortran order) of a .npy header, by NumPy's own parser; None for an object dtype."""
    fileobj = io.BytesIO(header)
    version = np.lib.format.read_magic(fileobj)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        shape, fortran, dtype = read(fileobj)
    except ValueError:
        return None  # np.load says what is wrong
    if dtype.hasobject:
        return None
    if len(_npy_headers) < 1024:
        _npy_headers[header] = (dtype, shape, fortran)
    return dtype, shape, fortran


_DECODERS: dict[str, Callable[[bytes], Any]] = {"npy": _load_npy, "cls": _int, "index": _int, "txt": _text,
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
    block = fileobj.read(_BLOCK)
    if len(block) < _BLOCK or any(block):
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
        except _Unusual:
            return self._read_with_tarfile(position)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{self._name}: sample {position} (byte {start}) unreadable ({exc})") from None
        if not sample:
            raise ValueError(f"{self._name}: sample {position}: no member at byte {start}")
        return sample

    def _data_end(self) -> int:
        """The byte after the last sample: the end-of-archive block, found by walking the headers from
        the last sample's (once per reader); the end of the file if the walk runs past it."""
        if self._end is None:
            position = int(self._offsets[-1])
            while True:
                header = os.pread(self._fd, _BLOCK, position)
                if len(header) < _BLOCK or header == _ZERO_BLOCK:
                    break
                try:
                    size = _number(header[124:136])
                except ValueError:
                    break  # the read reports it
                position += _BLOCK + -(-size // _BLOCK) * _BLOCK
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


# --- tar headers, by hand: tarfile costs ~0.1 ms a header, as much as reading a 64 KB sample ----------
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = frozenset(b"0\x007")  # tarfile.REGULAR_TYPES but GNU sparse (left to tarfile)
_SKIPPED = frozenset(b"123456")  # links, devices, directories, FIFOs: not samples' members
_LONG_NAME, _PAX = ord("L"), ord("x")


class _Unusual(Exception):
    """A header `_split` leaves to tarfile."""


def _split(data: bytes) -> dict[str, Any]:
    """The sample in `data` (the bytes from its first header up to the next sample's): the regular
    members of its key, as tarfile reads them (ustar prefix, GNU long names, pax path and size; checksums
    checked; a zero block ends it). ValueError for a bad or cut header or member; _Unusual for the rest."""
    sample: dict[str, Any] = {}
    position, end = 0, len(data)
    long_name: str | None = None
    pax: dict[str, str] = {}
    while position < end:
        header = data[position:position + _BLOCK]
        if len(header) < _BLOCK:
            raise ValueError(f"truncated header at +{position}")
        if header == _ZERO_BLOCK:
            break
        _check_sum(header)
        kind = header[156]
        size = int(pax["size"]) if "size" in pax else _number(header[124:136])
        begin = position + _BLOCK
        if begin + size > end:
            raise ValueError(f"truncated: a member's data ends past byte +{end}")
        position = begin + -(-size // _BLOCK) * _BLOCK
        if kind == _LONG_NAME:
            long_name = _text_field(data[begin:begin + size])
            continue
        if kind == _PAX:
            pax = _pax_records(data[begin:begin + size])
            continue
        if kind not in _REGULAR and kind not in _SKIPPED:
            raise _Unusual
        if kind not in _REGULAR or (kind == 0 and _text_field(header[0:100]).endswith("/")):
            position = begin  # a link, device or directory (a V7 one: "name/"): tarfile skips no data
            long_name, pax = None, {}
            continue
        name = pax.get("path") or long_name or _ustar_name(header)
        long_name, pax = None, {}
        parts = split_name(name)
        if parts is None:
            continue
        if sample and parts[0] != sample["__key__"]:
            break
        sample["__key__"] = parts[0]
        sample[parts[1]] = data[begin:begin + size]
    return sample


def _check_sum(header: bytes) -> None:
    stored = _number(header[148:156])
    unsigned = 256 + sum(header) - sum(header[148:156])
    if stored != unsigned and stored != 256 + sum(struct.unpack_from("148b8x356b", header)):
        raise ValueError("bad header checksum")


def _number(field: bytes) -> int:
    """A header's numeric field: octal ASCII, or base-256 (first byte 0x80, or 0xff for negative)."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ValueError("invalid number in a header") from None


def _text_field(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _ustar_name(header: bytes) -> str:
    name, prefix = _text_field(header[0:100]), _text_field(header[345:500])
    return f"{prefix}/{name}" if prefix else name


def _pax_records(data: bytes) -> dict[str, str]:
    """An extended (pax) header's records, `LENGTH KEY=VALUE\\n`; _Unusual for what changes how the
    member is read beyond its path and size (GNU sparse, binary names)."""
    records: dict[str, str] = {}
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        equals = data.find(b"=", space)
        if space < 0 or equals < 0 or not data[position:space].isdigit():
            break  # what tarfile's record pattern does not match ends the records
        length = int(data[position:space])
        if length == 0:
            raise ValueError("invalid pax header")
        key = data[space + 1:equals].decode("utf-8", "surrogateescape")
        records[key] = data[equals + 1:position + length - 1].decode("utf-8", "surrogateescape")
        position += length
    if records.get("hdrcharset") == "BINARY" or any(key.startswith("GNU.sparse") for key in records):
        raise _Unusual
    return records


def decode(raw: dict[str, Any]) -> dict[str, Any]:
    """The default decode of a tar sample (see the module's docstring)."""
    out: dict[str, Any] = {}
    for extension, value in raw.items():
        out[_decoded_name(extension, raw)] = _decode_value(extension, value)
    return out


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
    size = sum(_BLOCK + -(-len(data) // _BLOCK) * _BLOCK for _, data in members)
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
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return _with_type(name, "npy"), buffer.getvalue()
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
