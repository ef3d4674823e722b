"""Sharded optimizer state (`zero_stage` 1 and 2), framework-free: how the trained tensors are split evenly
over the ranks, and the checkpoint file that holds the state independent of that split.

The tensors of one optimizer group and dtype are laid end to end as one flat run of elements (in the order
the optimizer holds them), padded so that every rank owns one contiguous slice of the same length: a model
with one large embedding is split as evenly as one of many small layers. A rank's slice is a list of
`Piece`s, each a run of one tensor's elements.

The state file is canonical: one entry per tensor and state name (`state.<index>.<name>`, the tensor's own
shape, `index` as torch's `Optimizer.state_dict` numbers parameters), whatever the world size or stage that
wrote it, so that a run resumes on any number of ranks, with or without sharding. Its layout is
safetensors' (an 8-byte little-endian header length, a JSON header of dtypes, shapes and byte offsets, the
data), so the safetensors library reads it too; written here by hand because the writer fills it slice by
slice, at offsets, as the ranks' slices reach rank 0 (the library writes a whole dict of tensors at once),
and read here by hand as a memory map of which each rank's slice is a few byte ranges.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

FORMAT = "hvdazure-optimizer-state/1"
STATE_FILE = "optimizer-state.safetensors"
ALIGN_BYTES = 64  # each rank's slice starts on a 64-byte boundary of the flat buffer (cache line, SIMD)
_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class Piece:
    """A run of one tensor's elements in a rank's slice: elements [start, start + length) of tensor `index`
    (flattened; `index` as the optimizer numbers its parameters), at element `at` of the slice."""

    index: int
    start: int
    length: int
    at: int


@dataclass(frozen=True)
class FlatPartition:
    """The tensors of one group and dtype (`indices`, `numels`, in order) as one flat buffer split over
    `world` ranks: each owns `shard_size` elements (a multiple of the alignment, at least one), the last
    ones padding past `total`."""

    indices: tuple[int, ...]
    numels: tuple[int, ...]
    world: int
    element_size: int

    @property
    def total(self) -> int:
        return sum(self.numels)

    @property
    def shard_size(self) -> int:
        align = max(1, ALIGN_BYTES // self.element_size)
        return max(align, math.ceil(math.ceil(self.total / self.world) / align) * align)

    @property
    def padded(self) -> int:
        return self.shard_size * self.world

    def offsets(self) -> list[int]:
        """Where each tensor starts in the flat buffer."""
        starts, at = [], 0
        for numel in self.numels:
            starts.append(at)
            at += numel
        return starts

    def pieces(self, rank: int) -> list[Piece]:
        """The runs of tensor elements rank `rank` owns, in flat order (none past the padding)."""
        first, last = rank * self.shard_size, (rank + 1) * self.shard_size
        found = []
        for index, start, numel in zip(self.indices, self.offsets(), self.numels, strict=True):
            lo, hi = max(first, start), min(last, start + numel)
            if lo < hi:
                found.append(Piece(index, lo - start, hi - lo, lo - first))
        return found

    def record(self) -> dict[str, Any]:
        """The manifest's record of this split."""
        return {"indices": list(self.indices), "numels": list(self.numels), "world": self.world,
                "shard_size": self.shard_size}


def even_share(partitions: Sequence[FlatPartition]) -> float:
    """A rank's elements of optimizer state over an even 1/world share of the unpadded total (1.0: exact)."""
    total = sum(p.total for p in partitions)
    return 0.0 if total == 0 else sum(p.shard_size for p in partitions) / (total / partitions[0].world)


# --- the state file ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One tensor of the state file: its safetensors dtype name, shape and byte offsets in the data."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def element_size(self) -> int:
        return _SIZES[self.dtype]


def entry_name(index: int, name: str) -> str:
    return f"state.{index}.{name}"


def layout(tensors: Mapping[str, tuple[str, Sequence[int]]]) -> dict[str, Entry]:
    """Each named tensor (dtype name, shape) at its byte offsets, in the order given."""
    entries, at = {}, 0
    for name, (dtype, shape) in tensors.items():
        if dtype not in _SIZES:
            raise ValueError(f"optimizer state {name!r}: dtype {dtype} cannot be written in a state file")
        size = math.prod(shape) * _SIZES[dtype]
        entries[name] = Entry(dtype, tuple(shape), at, at + size)
        at += size
    return entries


class StateFileWriter:
    """Writes a state file of known entries piece by piece: the header first, then each run of bytes at its
    offset as it arrives (from whichever rank holds it). Nothing else reads the file until `close`."""

    def __init__(self, file: BinaryIO, entries: Mapping[str, Entry], metadata: Mapping[str, Any]) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": FORMAT,
                                                   **{k: json.dumps(v) for k, v in metadata.items()}}}
        header.update({name: {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
                       for name, e in entries.items()})
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes with spaces
        self.file, self.entries, self.base = file, entries, 8 + len(text)
        file.write(struct.pack("<Q", len(text)) + text)
        file.truncate(self.base + max((e.end for e in entries.values()), default=0))

    def write(self, name: str, first_element: int, data: bytes | memoryview) -> None:
        """`data`: consecutive elements of entry `name`, from element `first_element` on."""
        entry = self.entries[name]
        at = entry.begin + first_element * entry.element_size
        if at + len(data) > entry.end:
            raise ValueError(f"{name}: {len(data)} bytes from element {first_element} run past its end")
        self.file.seek(self.base + at)
        self.file.write(data)


class StateFile:
    """A state file, memory-mapped: its entries, metadata and byte ranges, read lazily (the pages a rank's
    slice needs, not the whole file)."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        data = memoryview(self._map) if self._map is not None else memoryview(b"")
        try:
            header = self._header(path, data)
        except BaseException:
            data.release()
            self.close()
            raise
        meta = header.pop("__metadata__")
        self.metadata = {k: json.loads(v) for k, v in meta.items() if k != "format"}
        self.entries = {name: Entry(e["dtype"], tuple(e["shape"]), *e["data_offsets"])
                        for name, e in header.items()}
        self._data = data[8 + struct.unpack("<Q", data[:8])[0]:]
        data.release()

    @staticmethod
    def _header(path: str, data: memoryview) -> dict[str, Any]:
        """The JSON header, or a ValueError naming the file when it is not a state file of this format."""
        if len(data) < 8:
            raise ValueError(f"{path}: not an optimizer state file (too short)")
        (length,) = struct.unpack("<Q", data[:8])
        try:
            header = json.loads(bytes(data[8:8 + length])) if 8 + length <= len(data) else None
        except ValueError:  # not UTF-8, or not JSON
            header = None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if not isinstance(header, dict) or not isinstance(meta, dict):
            raise ValueError(f"{path}: not an optimizer state file (no safetensors header with hvdazure's "
                             "metadata)")
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not an optimizer state file of this hvdazure ({meta.get('format')!r})")
        return header

    def read(self, name: str, first_element: int = 0, count: int | None = None) -> memoryview:
        """Elements [first_element, first_element + count) of entry `name` (all by default), as bytes."""
        entry = self.entries[name]
        count = entry.numel - first_element if count is None else count
        begin = entry.begin + first_element * entry.element_size
        return self._data[begin:begin + count * entry.element_size]

    def names(self) -> Iterator[tuple[int, str]]:
        """(tensor index, state name) of every entry."""
        for name in self.entries:
            _, index, key = name.split(".", 2)
            yield int(index), key

    def close(self) -> None:
        """Unmap the file (once no tensor made over its bytes is left: until then the map stays)."""
        if getattr(self, "_data", None) is not None:
            self._data.release()
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
