"""The `.npy` codec of tar members and Parquet cells: `np.save`'s bytes, and `np.load`'s arrays without its
~0.2 ms a call (each distinct header parsed once, by NumPy's own parser)."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

NPY_MAGIC = b"\x93NUMPY"
_headers: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}  # header bytes -> parsed


def save_npy(array: np.ndarray) -> bytes:
    """`np.save`'s bytes of `array` (no pickles)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def load_npy(data: bytes) -> np.ndarray:
    """What `np.load(io.BytesIO(data), allow_pickle=False)` gives (a writeable array, C or Fortran order),
    its header parsed once per distinct header (np.load from a BytesIO costs ~0.2 ms a call); anything
    np.load would refuse or treat specially (object dtypes, short data, format 3.0) goes to np.load."""
    if data[:6] == NPY_MAGIC and data[6] in (1, 2):
        start = 10 if data[6] == 1 else 12
        header = data[:start + int.from_bytes(data[8:start], "little")]
        parsed = _headers.get(header)
        if parsed is None:
            parsed = _parse_header(header)
        if parsed is not None:
            dtype, shape, fortran = parsed
            count = math.prod(shape)
            if len(data) - len(header) >= count * dtype.itemsize:
                flat = np.frombuffer(data, dtype, count, len(header))
                array = flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
                return array.copy(order="K")  # writeable, as np.load's
    loaded: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    return loaded


def stacked_npy(values: list[Any]) -> np.ndarray | None:
    """`.npy` values that all have one header (a native numeric dtype, C order, ndim >= 1) as one stacked
    array: their data joined into one writeable buffer. None for any other values."""
    first = values[0]
    if not isinstance(first, bytes | memoryview) or bytes(first[:6]) != NPY_MAGIC or first[6] not in (1, 2):
        return None
    start = 10 if first[6] == 1 else 12
    header = bytes(first[:start + int.from_bytes(first[8:start], "little")])
    parsed = _headers.get(header) or _parse_header(header)
    if parsed is None:
        return None
    dtype, shape, fortran = parsed
    size = math.prod(shape) * dtype.itemsize
    if fortran or not shape or dtype.kind not in "biufc" or not dtype.isnative or \
            any(len(v) != len(header) + size or v[:len(header)] != header for v in values):
        return None  # np.load would keep trailing bytes out; different headers: decoded one by one
    joined = bytearray().join(v[len(header):] for v in values)
    return np.frombuffer(joined, dtype).reshape((len(values), *shape))


def _parse_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool] | None:
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
    if len(_headers) < 1024:
        _headers[header] = (dtype, shape, fortran)
    return dtype, shape, fortran
