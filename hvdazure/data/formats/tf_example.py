"""`tf.train.Example` without TensorFlow: parsed and serialized by hand, from the protobuf wire format
(PyTorch users should not need TensorFlow, and protobuf has no Example descriptor without it). The
TFRecord framing around a record is tfrecord.py's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

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
