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
    array = np.load(io.BytesIO(data), allow_pickle=False)
    return array[()] if array.ndim == 0 else array


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
    """Reads samples by position: seeks to the sample's first header and reads its members."""

    def __init__(self, path: str, offsets: np.ndarray, name: str) -> None:
        self._file: BinaryIO = open(path, "rb")  # noqa: SIM115 -- closed by close()
        self._offsets = offsets
        self._name = name

    def read(self, position: int) -> dict[str, Any]:
        start = int(self._offsets[position])
        stop = int(self._offsets[position + 1]) if position + 1 < len(self._offsets) else None
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
        self._file.close()


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
