"""Tar headers, parsed by hand: the regular members in a span of a tar's bytes, and header checksums.

What tarfile reads, as tarfile reads it (ustar prefix, GNU long names, pax path and size; a zero block
ends the archive); a header that changes how a member is read beyond that (GNU sparse files, global pax
headers, binary pax names, ...) raises `Unusual`, for the caller to read with tarfile instead.
"""

# Hand-written: tarfile costs ~0.1 ms a header (a 64 KB read), needs a file object, sums one at a time

from __future__ import annotations

import struct
import tarfile
from collections.abc import Iterator

import numpy as np

BLOCK = tarfile.BLOCKSIZE
ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")  # tarfile.REGULAR_TYPES but GNU sparse (left to tarfile)
_SKIPPED = frozenset(b"123456")  # links, devices, directories, FIFOs: not samples' members
_LONG_NAME, _PAX = ord("L"), ord("x")
_SUMS_ONE_BY_ONE = 4  # at most this many headers in a batch: their checksums summed in Python, not NumPy


class Unusual(Exception):
    """A header `regular_members` leaves to tarfile."""


def regular_members(data: bytes | memoryview,
                    headers: list[bytes] | None = None) -> Iterator[tuple[str, int, int]]:
    """(name, start, size) of each regular member in `data` (bytes starting at a header), in order, as
    tarfile reads them (checksums checked; a zero block or the end of `data` ends them); links, devices and
    directories skipped. ValueError for a bad or cut header or member; Unusual for the rest. `headers`:
    the checksums are left to the caller, each header appended to it (before its member is given)."""
    position, end = 0, len(data)
    long_name: str | None = None
    pax: dict[str, str] = {}
    while position < end:
        header = bytes(data[position:position + BLOCK])
        if len(header) < BLOCK:
            raise ValueError(f"truncated header at +{position}")
        if header == ZERO_BLOCK:
            return
        if headers is None:
            _check_sum(header)
        else:
            headers.append(header)
        kind = header[156]
        size = int(pax["size"]) if "size" in pax else number(header[124:136])
        begin = position + BLOCK
        if begin + size > end:
            raise ValueError(f"truncated: a member's data ends past byte +{end}")
        position = begin + -(-size // BLOCK) * BLOCK
        if kind == _LONG_NAME:
            long_name = _text_field(bytes(data[begin:begin + size]))
            continue
        if kind == _PAX:
            pax = _pax_records(bytes(data[begin:begin + size]))
            continue
        if kind not in _REGULAR and kind not in _SKIPPED:
            raise Unusual
        if kind not in _REGULAR or (kind == 0 and _text_field(header[0:100]).endswith("/")):
            position = begin  # a link, device or directory (a V7 one: "name/"): tarfile skips no data
            long_name, pax = None, {}
            continue
        name = pax.get("path") or long_name or _ustar_name(header)
        long_name, pax = None, {}
        yield name, begin, size


def bad_sums(headers: list[bytes]) -> list[int]:
    """The indexes of the headers whose checksum is wrong: a few summed one by one (NumPy's call costs
    more than Python's sums), more all at once."""
    if len(headers) > _SUMS_ONE_BY_ONE:
        bad: list[int] = np.flatnonzero(~_sums_match(headers)).tolist()
        return bad
    out = []
    for i, header in enumerate(headers):
        try:
            _check_sum(header)
        except ValueError:
            out.append(i)
    return out


def _sums_match(headers: list[bytes]) -> np.ndarray:
    """Whether each header's checksum is right (what `_check_sum` checks), the sums of all at once."""
    blocks = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), BLOCK)
    field = blocks[:, 148:156].astype(np.int64)
    unsigned = blocks.sum(axis=1, dtype=np.int64) - field.sum(axis=1) + 256
    # the stored sum as tarfile writes it, six octal digits, NUL, space; any other spelling: _check_sum
    digits = field[:, :6] - ord("0")
    stored = digits @ (8 ** np.arange(5, -1, -1, dtype=np.int64))
    written = ((digits >= 0) & (digits <= 7)).all(axis=1) & (field[:, 6] == 0) & (field[:, 7] == ord(" "))
    match: np.ndarray = written & (stored == unsigned)
    for i in np.flatnonzero(~match).tolist():  # a signed sum, as some old tars have, or a bad header
        try:
            _check_sum(headers[i])
            match[i] = True
        except ValueError:
            pass
    return match


def _check_sum(header: bytes) -> None:
    stored = number(header[148:156])
    unsigned = 256 + sum(header) - sum(header[148:156])
    if stored != unsigned and stored != 256 + sum(struct.unpack_from("148b8x356b", header)):
        raise ValueError("bad header checksum")


def number(field: bytes) -> int:
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
    name, prefix = _text_field(header[0:100]), _text_field(header[345:500]) if header[345] else ""
    return f"{prefix}/{name}" if prefix else name


def _pax_records(data: bytes) -> dict[str, str]:
    """An extended (pax) header's records, `LENGTH KEY=VALUE\\n`; Unusual for what changes how the
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
        raise Unusual
    return records
