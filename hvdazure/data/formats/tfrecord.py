"""TFRecord shards: `tf.train.Example` records, read, written and parsed without TensorFlow.

A record is framed as uint64 length, uint32 masked CRC32C of the length, the data, uint32 masked CRC32C
of the data (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2**32). Both CRCs are
checked when a shard is indexed and on every read. A record's offset is the byte offset of its length.

The raw sample is the record's bytes: a batch decode such as `tf.io.parse_example(records, spec)` takes
them as they are. `parse_example` parses one without TensorFlow (by hand, from the protobuf wire format:
PyTorch users should not need TensorFlow, and protobuf has no Example descriptor without it).

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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from hvdazure.data.formats import Columns, columns_of, runs_of

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


# --- tf.train.Example, by hand ---------------------------------------------------------------------------
# Example { Features features = 1; }  Features { map<string, Feature> feature = 1; }
# Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
# BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
# Int64List { repeated int64 value = 1 [packed]; }
_VARINT, _FIXED64, _DELIMITED, _FIXED32 = 0, 1, 2, 5
_BYTES, _FLOAT, _INT64 = 1, 2, 3


def parse_example(record: bytes) -> dict[str, np.ndarray]:
    """The features of a serialized tf.train.Example: bytes_list -> object array of bytes, float_list ->
    float32, int64_list -> int64 (1-D, as TensorFlow stores them). ValueError for a malformed record."""
    buf = memoryview(record)
    features: dict[str, np.ndarray] = {}
    try:
        for field, wire, value in _fields(buf, 0, len(buf)):
            if field == 1 and wire == _DELIMITED:
                for entry_field, entry_wire, entry in _fields(buf, *value):
                    if entry_field == 1 and entry_wire == _DELIMITED:
                        key, feature = _map_entry(buf, *entry)
                        features[key] = feature
    except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"not a tf.train.Example ({exc})") from None
    return features


def _map_entry(buf: memoryview, start: int, end: int) -> tuple[str, np.ndarray]:
    key = ""
    feature: tuple[int, int] = (start, start)
    for field, wire, value in _fields(buf, start, end):
        if field == 1 and wire == _DELIMITED:
            key = bytes(buf[value[0]:value[1]]).decode()
        elif field == 2 and wire == _DELIMITED:
            feature = value
    return key, _feature(buf, *feature)


def _feature(buf: memoryview, start: int, end: int) -> np.ndarray:
    """One Feature: the last kind set wins (a oneof); a kind given twice is merged, as protobuf merges."""
    kind = 0
    pieces: list[tuple[int, int]] = []
    for field, wire, value in _fields(buf, start, end):
        if field in (_BYTES, _FLOAT, _INT64) and wire == _DELIMITED:
            if field != kind:
                kind, pieces = field, []
            pieces.append(value)
    if kind == _BYTES:
        values = [bytes(buf[v[0]:v[1]]) for s, e in pieces for f, w, v in _fields(buf, s, e)
                  if f == 1 and w == _DELIMITED]
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
    if kind == _INT64:
        return _concatenate([_int64s(buf, s, e) for s, e in pieces], np.int64)
    if kind == _FLOAT:
        return _concatenate([_floats(buf, s, e) for s, e in pieces], np.float32)
    return np.empty(0, dtype=np.float32)  # a Feature with no kind set


def _floats(buf: memoryview, start: int, end: int) -> np.ndarray:
    parts = []
    for field, wire, value in _fields(buf, start, end):
        if field == 1 and wire == _DELIMITED:  # packed
            data = bytes(buf[value[0]:value[1]])
            if len(data) % 4:
                raise ValueError("a packed float list whose length is not a multiple of 4")
            parts.append(np.frombuffer(data, dtype="<f4"))
        elif field == 1 and wire == _FIXED32:
            parts.append(np.frombuffer(bytes(buf[value[0]:value[1]]), dtype="<f4"))
    return _concatenate(parts, np.float32)


def _int64s(buf: memoryview, start: int, end: int) -> np.ndarray:
    parts = []
    for field, wire, value in _fields(buf, start, end):
        if field == 1 and wire == _DELIMITED:  # packed
            parts.append(_packed_varints(bytes(buf[value[0]:value[1]])))
        elif field == 1 and wire == _VARINT:
            parts.append(np.array([value], dtype=np.uint64).view(np.int64))
    return _concatenate(parts, np.int64)


def _concatenate(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message in buf[start:end]: an int for a varint, (start, end)
    of the bytes for the other wire types."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield field, wire, value
            continue
        if wire == _DELIMITED:
            length, pos = _varint(buf, pos)
        elif wire in (_FIXED64, _FIXED32):
            length = 8 if wire == _FIXED64 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos + length > end:
            raise ValueError("a field runs past the end of its message")
        yield field, wire, (pos, pos + length)
        pos += length


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise ValueError("a varint longer than 10 bytes")


def _packed_varints(data: bytes) -> np.ndarray:
    """Packed varints as int64 (two's complement, as protobuf encodes a negative int64), vectorised."""
    if len(data) <= 16:  # a label, a shape: NumPy's overhead would dominate
        numbers: list[int] = []
        pos, view = 0, memoryview(data)
        while pos < len(data):
            try:
                number, pos = _varint(view, pos)
            except IndexError:
                raise ValueError("a packed int64 list cut inside a varint") from None
            numbers.append(number)
        return np.array(numbers, dtype=np.uint64).view(np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.max() < 0x80:  # every value in one byte: 0..127
        return raw.astype(np.int64)
    last = raw < 0x80
    if not last[-1]:
        raise ValueError("a packed int64 list cut inside a varint")
    if not (~last[:-1] & ~last[1:]).any():  # every varint 1 or 2 bytes (0..16383: bytes, pixels, labels)
        ends = np.flatnonzero(last)
        low = raw.astype(np.int64)
        second = np.zeros(raw.size, dtype=bool)
        second[1:] = ~last[:-1]
        values2 = low[ends]
        two = np.flatnonzero(second[ends])
        values2[two] = (values2[two] << 7) | (low[ends[two] - 1] & 0x7F)
        return values2
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > 10:
        raise ValueError("a varint longer than 10 bytes")
    values = (raw[starts] & 0x7F).astype(np.uint64)
    for k in range(1, longest):  # the k-th byte of each varint long enough to have one (most have 1 or 2)
        more = np.flatnonzero(lengths > k)
        values[more] |= (raw[starts[more] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values.view(np.int64)


def encode_example(features: Mapping[str, Any]) -> bytes:
    """A serialized tf.train.Example (what `tf.train.Example.SerializeToString()` gives) of features given
    as bytes, str, numbers or arrays of them: integers and booleans -> int64_list, floating point ->
    float_list (float32), bytes / str (UTF-8) -> bytes_list; arrays are flattened."""
    entries = []
    for key in features:
        feature = _encode_feature(features[key], key)
        entry = _delimited(1, key.encode()) + _delimited(2, feature)
        entries.append(_delimited(1, entry))
    return _delimited(1, b"".join(entries))


def _encode_feature(value: Any, key: str) -> bytes:
    if isinstance(value, bytes | str):
        value = [value]
    if isinstance(value, list | tuple) and value and all(isinstance(item, bytes | str) for item in value):
        value = np.array(value, dtype=object)  # not np.asarray: an "S" array drops trailing NUL bytes
    array = np.asarray(value)
    if array.dtype.kind in "biu":
        return _delimited(_INT64, _delimited(1, _encode_varints(array.reshape(-1).astype(np.int64))))
    if array.dtype.kind == "f":
        return _delimited(_FLOAT, _delimited(1, array.reshape(-1).astype("<f4").tobytes()))
    if array.dtype.kind in "OSU":
        items = [item.encode() if isinstance(item, str) else item for item in array.reshape(-1).tolist()]
        if not all(isinstance(item, bytes) for item in items):
            raise TypeError(f"feature {key!r}: only bytes and str go into a bytes_list")
        return _delimited(_BYTES, b"".join(_delimited(1, item) for item in items))
    raise TypeError(f"feature {key!r}: cannot store {array.dtype} in a tf.train.Example")


def _delimited(field: int, payload: bytes) -> bytes:
    return _varint_bytes(field << 3 | _DELIMITED) + _varint_bytes(len(payload)) + payload


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_varints(values: np.ndarray) -> bytes:
    """int64 values as packed varints (a negative one in 10 bytes), vectorised."""
    unsigned = values.view(np.uint64)[:, None]
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    shifted = unsigned >> shifts
    count = np.maximum((shifted != 0).sum(axis=1), 1)[:, None]
    position = np.arange(10)[None, :]
    continued = np.where(position < count - 1, 0x80, 0).astype(np.uint8)
    groups = (shifted & np.uint64(0x7F)).astype(np.uint8) | continued
    encoded: bytes = groups[position < count].tobytes()
    return encoded


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
