"""Parquet shards: one sample a row, read with pyarrow. A sample's offset is its row number.

The raw sample is `{column: value}` of one row: numbers, str, bytes and nested values as Python objects
(pyarrow's `as_py`), a list column of numbers as a 1-D NumPy array. A reader reads a row group whole and
keeps it for the next rows of that group: readers of a shard in random order pay one row group a row.

What `write_shards` writes (`encode` + `Writer`): Python and NumPy scalars as int64 / float64 / bool /
string / binary columns of their type, 1-D arrays as list columns of their dtype (readable by any Parquet
tool), arrays of 2 or more dimensions as binary columns of `.npy` bytes (shape and dtype included, as no
list type holds them). The default `decode` loads `.npy` bytes (by their magic, b"\\x93NUMPY") back into
arrays and leaves every other value as it is.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from hvdazure.data.formats import Columns, columns_of
from hvdazure.data.formats.npy import NPY_MAGIC, load_npy, save_npy

ROW_GROUP_BYTES = 8 * 1024 * 1024  # a row group is this large, about: what a random read costs at most


def scan(fileobj: BinaryIO, size: int, name: str) -> np.ndarray:
    """One offset a row: 0 .. rows - 1 (from the footer; the rows themselves are not read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(fileobj).metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{name}: not a readable Parquet file ({_first_line(exc)})") from None
    return np.arange(rows, dtype=np.int64)


class Reader:
    """Reads rows by position, one row group at a time (the last one read is kept)."""

    def __init__(self, path: str, offsets: np.ndarray, name: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._errors = (pa.ArrowException, OSError)
        self._name = name
        self._offsets = offsets
        try:
            self._file = pq.ParquetFile(path)
        except self._errors as exc:
            raise ValueError(f"{name}: not a readable Parquet file ({_first_line(exc)})") from None
        metadata = self._file.metadata
        self._starts = np.cumsum([0] + [metadata.row_group(g).num_rows
                                        for g in range(metadata.num_row_groups)]).tolist()
        self._group = -1
        self._columns: dict[str, Callable[[int], Any]] = {}

    def read(self, position: int) -> dict[str, Any]:
        row = int(self._offsets[position])
        group = bisect.bisect_right(self._starts, row) - 1
        if not 0 <= group < len(self._starts) - 1:
            raise ValueError(f"{self._name}: row {row} (sample {position}) is not in the file "
                             f"({self._starts[-1]} rows)")
        if group != self._group:
            self._load(group, position)
        row -= self._starts[group]
        return {name: value(row) for name, value in self._columns.items()}

    def read_many(self, positions: Sequence[int], views: bool = False) -> list[dict[str, Any]]:
        """The rows at `positions` (ascending), as `read` gives them: each row group read once."""
        return [self.read(position) for position in positions]

    def _load(self, group: int, position: int) -> None:
        try:
            table = self._file.read_row_group(group)
        except self._errors as exc:
            raise ValueError(f"{self._name}: row group {group} (sample {position}) unreadable "
                             f"({_first_line(exc)})") from None
        self._columns = {name: _getter(table.column(name).combine_chunks()) for name in table.column_names}
        self._group = group

    def close(self) -> None:
        self._columns = {}
        self._file.close()


def _getter(column: Any) -> Callable[[int], Any]:
    """row -> the value of a column: a list of numbers as a NumPy array, anything else as_py."""
    import pyarrow as pa

    kind = column.type
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)) and (
            pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
            or pa.types.is_boolean(kind.value_type)):
        def as_array(row: int) -> Any:
            values = column[row].values
            # a copy: arrow's buffers are read-only, and torch warns on (and may write to) such arrays
            return None if values is None else np.array(values.to_numpy(zero_copy_only=False))
        return as_array
    return lambda row: column[row].as_py()


def decode(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The default decode: `.npy` bytes back into arrays; every other value as it is."""
    return {name: load_npy(value) if isinstance(value, bytes) and value.startswith(NPY_MAGIC) else value
            for name, value in raw.items()}


def decode_columns(raws: list[Mapping[str, Any]]) -> Columns | None:
    """The default decode of a micro-batch by columns (formats/__init__.py): each row decoded, then
    arrays of one dtype and shape stacked."""
    return columns_of([decode(raw) for raw in raws])


def encode(sample: Mapping[str, Any], key: str) -> tuple[dict[str, Any], int]:
    """A sample as one row (see the module's docstring) and about how many bytes it adds to a shard."""
    row: dict[str, Any] = {}
    size = 0
    for name, value in sample.items():
        if name == "__key__":
            continue
        if isinstance(value, np.ndarray) and value.ndim >= 2:
            value = save_npy(value)
        elif isinstance(value, np.ndarray) and value.dtype.kind == "O":
            raise TypeError(f"field {name!r}: an object array cannot be stored (give bytes or numbers)")
        row[name] = value
        size += value.nbytes if isinstance(value, np.ndarray | np.generic) else \
            len(value) if isinstance(value, bytes | str) else 8
    return row, size


class Writer:
    """Writes rows to one Parquet file, a row group each ROW_GROUP_BYTES (about) of samples."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._fileobj = fileobj
        self._rows: list[dict[str, Any]] = []
        self._bytes = 0
        self._writer: Any = None
        self._schema: Any = None
        self._written = 0

    def add(self, row: dict[str, Any], size: int) -> int:
        """Add one row (written with its row group); its row number."""
        if self._rows and row.keys() != self._rows[0].keys():
            raise ValueError(f"a sample with fields {sorted(row)}, after samples with "
                             f"{sorted(self._rows[0])}: every row of a Parquet shard has the same columns")
        self._rows.append(row)
        self._bytes += size
        self._written += 1
        if self._bytes >= ROW_GROUP_BYTES:
            self._flush()
        return self._written - 1

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        table = table_of(self._rows, self._schema)
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._fileobj, self._schema)
        self._writer.write_table(table, row_group_size=len(self._rows))
        self._rows, self._bytes = [], 0

    def close(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._rows:
            self._flush()
        if self._writer is None:  # an empty shard: a file with no rows (and no columns)
            pq.write_table(pa.table({}), self._fileobj)
        else:
            self._writer.close()


def table_of(rows: list[dict[str, Any]], schema: Any = None) -> Any:
    """A pyarrow Table of rows with the same fields, typed as the module's docstring says (or as `schema`)."""
    import pyarrow as pa

    columns = {name: _column([row[name] for row in rows], name) for name in rows[0]}
    if schema is None:  # a column of None only: binary (a file's missing bytes, in pack_folder's rows)
        columns = {name: column.cast(pa.binary()) if pa.types.is_null(column.type) else column
                   for name, column in columns.items()}
    table = pa.table(columns)
    return table if schema is None else table.cast(schema)


def _column(values: list[Any], name: str) -> Any:
    import pyarrow as pa

    first = next((value for value in values if value is not None), None)
    if isinstance(first, np.ndarray) and first.ndim == 1 and all(value is not None for value in values):
        dtype = first.dtype
        flat = np.concatenate([np.asarray(v, dtype=dtype).reshape(-1) for v in values])
        offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    if isinstance(first, np.ndarray | np.generic) and all(value is not None for value in values):
        return pa.array(np.asarray(values, dtype=first.dtype))
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError) as exc:
        raise TypeError(f"field {name!r}: cannot store its values in Parquet ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
