"""TFRecord shards: `tf.train.Example` records, read, written and parsed without TensorFlow.

A record is framed as uint64 length, uint32 masked CRC32C of the length, the data, uint32 masked CRC32C
of the data (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2**32). Both CRCs are
checked when a shard is indexed and on every read. A record's offset is the byte offset of its length.

The raw sample is the record's bytes: a batch decode such as `tf.io.parse_example(records, spec)` takes
them as they are. `parse_example` (tf_example.py) parses one without TensorFlow.

How `write_shards` stores a sample (`encode_sample`), a stable convention:
- A NumPy array or NumPy scalar NAME of a numeric or boolean dtype is three features: NAME, a bytes_list
  of one value, the array's bytes in C order, little-endian; NAME.dtype, a bytes_list of one value, the
  NumPy dtype's name (b"float64", b"uint8", b"bool": the names `tf.as_dtype` takes too); NAME.shape, an
  int64_list of its shape (empty for a 0-d one). In TensorFlow: parse NAME as
  `tf.io.FixedLenFeature([], tf.string)`, then `tf.io.decode_raw(parsed[NAME], tf.float64)` and reshape
  to (-1, *shape) (uint32 / uint64, which decode_raw lacks: decode int32 / int64 and `tf.bitcast`).
- Python ints and bools are int64_lists, floats float_lists (float32), str (UTF-8) and bytes bytes_lists,
  lists of them flat lists of their kind, as a tf.train.Example holds them; such a value that is not 1-D
  (a scalar included) also gets its shape, an int64_list NAME.shape.
The default `decode` parses the record and gives each array back as it was written (dtype, shape; a 0-d
one as a NumPy scalar), a list value with a NAME.shape reshaped (a byte string as bytes), and drops the
.dtype and .shape features. Records written before the raw convention (arrays as int64 / float lists plus
NAME.shape where not 1-D) read as they always did: int64 for integers and booleans, float32 for floats.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from hvdazure.data.formats import Columns, columns_of, runs_of
from hvdazure.data.formats.tf_example import encode_example, parse_example

SHAPE_SUFFIX = ".shape"
DTYPE_SUFFIX = ".dtype"
RAW_KINDS = "biufc"  # NumPy dtype kinds stored raw: bool, signed, unsigned, floating, complex
_HEADER = 12  # uint64 length + uint32 masked crc of it
_FOOTER = 4   # uint32 masked crc of the data
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of `data`."""
    import google_crc32c  # here: only TFRecord shards need it

    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as it is stored in a TFRecord file."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record))


def _read_record(fileobj: BinaryIO, offset: int, size: int | None, where: str) -> bytes:
    """The checked data of the record whose length field is at `offset` (fileobj positioned there)."""
    header = fileobj.read(_HEADER)
    if len(header) < _HEADER:
        raise ValueError(f"{where}: truncated (length field cut at byte {offset + len(header)})")
    (length,) = struct.unpack("<Q", header[:8])
    if struct.unpack("<I", header[8:])[0] != masked_crc(header[:8]):
        raise ValueError(f"{where}: bad CRC of the length field")
    end = offset + _HEADER + length + _FOOTER
    if size is not None and end > size:
        raise ValueError(f"{where}: truncated (the record ends at byte {end}, the file has {size})")
    body = fileobj.read(length + _FOOTER)
    if len(body) < length + _FOOTER:
        raise ValueError(f"{where}: truncated (the record ends at byte {end}, the file has "
                         f"{offset + _HEADER + len(body)})")
    data = body[:length]
    if struct.unpack("<I", body[length:])[0] != masked_crc(data):
        raise ValueError(f"{where}: bad CRC of the data ({length} bytes)")
    return data


def scan(fileobj: BinaryIO, size: int, name: str) -> np.ndarray:
    """The offset of every record, each record's two CRCs checked on the way."""
    offsets: list[int] = []
    offset = 0
    fileobj.seek(0)
    while offset < size:
        data = _read_record(fileobj, offset, size, f"{name}: record {len(offsets)} (byte {offset})")
        offsets.append(offset)
        offset += _HEADER + len(data) + _FOOTER
    return np.asarray(offsets, dtype=np.int64)


class Reader:
    """Reads records by position, checking both CRCs of each: one pread a record (up to the next
    record's offset; the last one's length read first)."""

    def __init__(self, path: str, offsets: np.ndarray, name: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._offsets = offsets
        self._name = name

    def read(self, position: int) -> bytes:
        offset = int(self._offsets[position])
        where = f"{self._name}: record {position} (byte {offset})"
        try:
            if position + 1 < len(self._offsets):
                framed = os.pread(self._fd, int(self._offsets[position + 1]) - offset, offset)
            else:
                framed = os.pread(self._fd, _HEADER, offset)
                if len(framed) == _HEADER:
                    framed += os.pread(self._fd, struct.unpack("<Q", framed[:8])[0] + _FOOTER,
                                       offset + _HEADER)
        except OSError as exc:
            raise ValueError(f"{where}: unreadable ({exc})") from None
        return _checked(framed, offset, where)

    def read_many(self, positions: Sequence[int], views: bool = False) -> list[bytes]:
        """The records at `positions` (ascending), as `read` gives them: each run of consecutive records
        is one pread of the bytes they span (the last record of the shard read by `read`), both CRCs of
        each record checked."""
        out: list[bytes] = []
        for run in runs_of(positions):
            tail = run[-1] == len(self._offsets) - 1
            inner = [position for position in run if position != len(self._offsets) - 1] if tail else run
            if inner:
                start, stop = int(self._offsets[inner[0]]), int(self._offsets[inner[-1] + 1])
                try:
                    span = memoryview(os.pread(self._fd, stop - start, start))
                except OSError as exc:
                    raise ValueError(f"{self._name}: record {inner[0]} (byte {start}): unreadable "
                                     f"({exc})") from None
                for position in inner:
                    offset = int(self._offsets[position])
                    framed = span[offset - start:int(self._offsets[position + 1]) - start]
                    out.append(_checked(framed, offset, f"{self._name}: record {position} (byte {offset})"))
            out += [self.read(position) for position in run[len(inner):]]
        return out

    def close(self) -> None:
        os.close(self._fd)


def _checked(framed: bytes | memoryview, offset: int, where: str) -> bytes:
    """The data of the framed record `framed` (read from `offset`), both CRCs checked."""
    if len(framed) < _HEADER:
        raise ValueError(f"{where}: truncated (length field cut at byte {offset + len(framed)})")
    (length,) = struct.unpack_from("<Q", framed)
    if struct.unpack_from("<I", framed, 8)[0] != masked_crc(bytes(framed[:8])):
        raise ValueError(f"{where}: bad CRC of the length field")
    end = offset + _HEADER + length + _FOOTER
    if len(framed) < _HEADER + length + _FOOTER:
        raise ValueError(f"{where}: truncated (the record ends at byte {end}, the file has "
                         f"{offset + len(framed)})")
    data = bytes(framed[_HEADER:_HEADER + length])
    if struct.unpack_from("<I", framed, _HEADER + length)[0] != masked_crc(data):
        raise ValueError(f"{where}: bad CRC of the data ({length} bytes)")
    return data


def encode_sample(sample: Mapping[str, Any]) -> bytes:
    """A sample as `write_shards` stores it: NumPy values raw (NAME bytes, NAME.dtype, NAME.shape), other
    values as tf.train.Example lists, plus NAME.shape where they are not 1-D (see the module's docstring)."""
    features: dict[str, Any] = {}
    for key, value in sample.items():
        if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in RAW_KINDS:
            array = np.asarray(value)
            little = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
            features[key] = little.tobytes()
            features[key + DTYPE_SUFFIX] = array.dtype.name
            features[key + SHAPE_SUFFIX] = np.asarray(array.shape, dtype=np.int64)
            continue
        features[key] = value
        shape = () if isinstance(value, bytes | str) else np.shape(value)
        if len(shape) != 1:
            features[key + SHAPE_SUFFIX] = np.asarray(shape, dtype=np.int64)
    return encode_example(features)


def decode(record: bytes) -> dict[str, Any]:
    """The default decode: parse_example, raw arrays and the shapes NAME.shape gives put back (see the
    module's docstring)."""
    features = parse_example(record)
    out: dict[str, Any] = {}
    for key, value in features.items():
        if key.endswith((SHAPE_SUFFIX, DTYPE_SUFFIX)) and key.rpartition(".")[0] in features:
            continue
        shape = features.get(key + SHAPE_SUFFIX)
        dtype = features.get(key + DTYPE_SUFFIX)
        if dtype is not None:
            value = _raw_array(key, value, dtype, shape)
        elif shape is not None:
            value = value.reshape(tuple(shape.tolist()))
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        out[key] = value
    return out


def decode_columns(records: list[bytes]) -> Columns | None:
    """The default decode of a micro-batch by columns (formats/__init__.py): each record decoded, then
    arrays of one dtype and shape stacked."""
    return columns_of([decode(record) for record in records])


def _raw_array(key: str, value: np.ndarray, dtype: np.ndarray, shape: np.ndarray | None) -> np.ndarray:
    """The array a raw feature holds (a writeable copy, native byte order); ValueError naming the
    feature for a dtype that is not numeric or boolean, or bytes that do not fill the shape."""
    if value.dtype != object or value.shape != (1,) or dtype.dtype != object or dtype.shape != (1,):
        raise ValueError(f"feature {key!r}: a raw array is one bytes value with one {key}{DTYPE_SUFFIX} "
                         "bytes value")
    kind = raw_dtype(dtype[0], key)
    dims = (-1,) if shape is None else tuple(shape.tolist())
    data = value[0]
    count = len(data) // kind.itemsize
    if len(data) % kind.itemsize or (shape is not None and count != int(np.prod(dims))):
        raise ValueError(f"feature {key!r}: {len(data)} bytes do not hold a {kind.name} array of shape "
                         f"{list(dims)}")
    array: np.ndarray = np.frombuffer(data, kind.newbyteorder("<"), count).astype(kind).reshape(dims)
    return array


def raw_dtype(name: bytes, key: str) -> np.dtype:
    """The NumPy dtype a NAME.dtype feature names; ValueError for one that is not numeric or boolean."""
    try:
        kind = np.dtype(name.decode())
    except (TypeError, ValueError, UnicodeDecodeError):
        kind = None
    if kind is None or kind.kind not in RAW_KINDS or kind.name != name.decode(errors="replace"):
        raise ValueError(f"feature {key!r}: {key}{DTYPE_SUFFIX} is {name!r}, not a NumPy numeric or bool "
                         "dtype name")
    return kind


def encode(sample: Mapping[str, Any], key: str) -> tuple[bytes, int]:
    """A sample as one framed record (`encode_sample`; `__key__` and None values left out) and its size."""
    record = frame(encode_sample({name: value for name, value in sample.items()
                                  if name != "__key__" and value is not None}))
    return record, len(record)


class Writer:
    """Writes framed records to one TFRecord file."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._fileobj = fileobj
        self._position = 0

    def add(self, record: bytes, size: int) -> int:
        """Write one record; the offset of its length field."""
        offset = self._position
        self._fileobj.write(record)
        self._position += len(record)
        return offset

    def close(self) -> None:
        pass
