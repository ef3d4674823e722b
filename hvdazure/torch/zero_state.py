"""A sharded optimizer's state in checkpoints (torch/zero.py's ShardedOptimizer says when, this module how):
the canonical state a checkpoint holds read as a `StateSource` (stage 0's `optimizer.pt`, or the sharded
state file of core/optimizer_shards.py), the plan every rank needs before its slice arrives, each rank's
slice cut from a source or written into the file, and the two one-way transfers through rank 0 (an alltoall
in which one rank sends), so that rank 0 never holds more than one rank's slice at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import horovod.torch as hvd
import torch

from hvdazure.core.optimizer_shards import (
    Entry,
    FlatPartition,
    StateFile,
    StateFileWriter,
    entry_name,
    layout,
)

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}


class Bucket(Protocol):
    """What the state code needs of one of ShardedOptimizer's buckets: its split, and this rank's slice of
    its weights (the tensor the user's optimizer holds, and keys its state by)."""

    partition: FlatPartition
    shard: torch.Tensor


class StateSource(Protocol):
    """Optimizer state in canonical form (per parameter, as torch's state_dict numbers them), to be cut into
    slices: a stage 0 `optimizer.pt` (or a state dict in memory), or a sharded checkpoint's state file."""

    param_groups: list[dict[str, Any]]

    def state_names(self, index: int) -> dict[str, tuple[str, bool]]:
        """The state names of tensor `index`: (dtype name, per element?)."""

    def elements(self, index: int, name: str, start: int, length: int) -> torch.Tensor:
        """A 1-D run of a per-element state's values (on the CPU)."""

    def scalar(self, index: int, name: str) -> torch.Tensor:
        """A state value that is not per element (e.g. Adam's step)."""


class DictSource:
    """A torch optimizer state dict (memory-mapped from `optimizer.pt`, or in memory) as a StateSource."""

    def __init__(self, state: Mapping[str, Any], numels: Mapping[int, int]) -> None:
        self.state, self.numels = state["state"], numels
        self.param_groups = [dict(g) for g in state["param_groups"]]

    def state_names(self, index: int) -> dict[str, tuple[str, bool]]:
        found = {}
        for name, value in self.state.get(index, {}).items():
            if isinstance(value, torch.Tensor):
                found[name] = (DTYPES[value.dtype], value.numel() == self.numels[index] and value.dim() > 0)
        return found

    def elements(self, index: int, name: str, start: int, length: int) -> torch.Tensor:
        return self.state[index][name].reshape(-1)[start:start + length]

    def scalar(self, index: int, name: str) -> torch.Tensor:
        return self.state[index][name]


class FileSource:
    """A sharded checkpoint's state file as a StateSource (memory-mapped: a slice reads its pages only)."""

    def __init__(self, file: StateFile) -> None:
        self.file = file
        self.param_groups = file.metadata["param_groups"]
        self._names: dict[int, dict[str, tuple[str, bool]]] = {}
        for index, name in file.names():
            entry = file.entries[entry_name(index, name)]
            self._names.setdefault(index, {})[name] = (entry.dtype, bool(file.metadata["per_element"].get(
                f"{index}.{name}", False)))

    def state_names(self, index: int) -> dict[str, tuple[str, bool]]:
        return self._names.get(index, {})

    def elements(self, index: int, name: str, start: int, length: int) -> torch.Tensor:
        entry = self.file.entries[entry_name(index, name)]
        if not length:
            return torch.empty(0, dtype=TORCH_DTYPES[entry.dtype])
        # copied out of the read-only map (a tensor over it would be writable in torch's eyes: it warns)
        return torch.frombuffer(bytearray(self.file.read(entry_name(index, name), start, length)),
                                dtype=TORCH_DTYPES[entry.dtype])

    def scalar(self, index: int, name: str) -> torch.Tensor:
        entry = self.file.entries[entry_name(index, name)]
        return torch.frombuffer(bytearray(self.file.read(entry_name(index, name))),
                                dtype=TORCH_DTYPES[entry.dtype]).reshape(entry.shape).clone()

    def full_state_dict(self, numels: Mapping[int, int], shapes: Mapping[int, torch.Size]) -> dict[str, Any]:
        """The whole state as torch's state dict (for a run without sharding: every rank holds it all)."""
        state: dict[int, dict[str, torch.Tensor]] = {}
        for index, names in self._names.items():
            for name, (_, per_element) in names.items():
                state.setdefault(index, {})[name] = (
                    self.elements(index, name, 0, numels[index]).clone().reshape(shapes[index])
                    if per_element else self.scalar(index, name))
        return {"state": state, "param_groups": [dict(g) for g in self.param_groups]}


def plan_from_source(buckets: Sequence[Bucket], source: StateSource) -> dict[str, Any]:
    """What every rank needs to know before its slice arrives, read from a canonical source: per flat,
    its per-element state names and dtypes and its scalars (one value for all its tensors: Adam's step),
    and the groups' settings."""
    flats = []
    for flat in buckets:
        names: dict[str, str] = {}
        scalars: dict[str, list[Any]] = {}
        for index in flat.partition.indices:
            here = source.state_names(index)
            if not here:
                continue
            per_element = {n: d for n, (d, each) in here.items() if each}
            if names and per_element != names:
                raise ValueError(f"optimizer state of parameter {index} has {sorted(per_element)}, its "
                                 f"neighbours {sorted(names)}: it cannot be split into one slice")
            names = per_element
            for n, (dtype, each) in here.items():
                if not each:
                    scalars.setdefault(n, [source.scalar(index, n).tolist(), dtype])
        flats.append({"names": dict(sorted(names.items())), "scalars": scalars})
    return {"flats": flats, "param_groups": settings_of(source.param_groups)}


def plan_of_state(buckets: Sequence[Bucket], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The plan of this rank's own slices (names, dtypes, scalars), as `plan_from_source` reads it."""
    flats = []
    for flat in buckets:
        state = optimizer.state.get(flat.shard, {})
        names, scalars = {}, {}
        for name, value in sorted(state.items()):
            if not isinstance(value, torch.Tensor):
                continue
            if value.dim() == 1 and value.numel() == flat.partition.shard_size:
                names[name] = DTYPES[value.dtype]
            else:
                scalars[name] = [value.tolist(), DTYPES[value.dtype]]
        flats.append({"names": names, "scalars": scalars})
    return {"flats": flats, "param_groups": settings_of(optimizer.param_groups)}


def slice_bytes(buckets: Sequence[Bucket], source: StateSource, plan: dict[str, Any],
                rank: int) -> torch.Tensor:
    """Rank `rank`'s slice of every per-element state, from the source, as one run of bytes."""
    parts = []
    for flat, described in zip(buckets, plan["flats"], strict=True):
        for name, dtype in described["names"].items():
            values = torch.zeros(flat.partition.shard_size, dtype=TORCH_DTYPES[dtype])
            for piece in flat.partition.pieces(rank):
                values[piece.at:piece.at + piece.length] = source.elements(piece.index, name, piece.start,
                                                                           piece.length)
            parts.append(values.view(torch.uint8))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def slices_state_dict(buckets: Sequence[Bucket], per_group: Sequence[int], plan: dict[str, Any],
                  data: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """An optimizer state dict of this rank's slices (`data`, as `slice_bytes` cut them for it), for the
    user's optimizer's load_state_dict (which casts and places each value as the optimizer expects):
    `per_group`, how many buckets (slices) each param group holds."""
    state: dict[int, dict[str, Any]] = {}
    at = 0
    for shard_index, (flat, described) in enumerate(zip(buckets, plan["flats"], strict=True)):
        entry: dict[str, Any] = {}
        for name, dtype in described["names"].items():
            size = flat.partition.shard_size * TORCH_DTYPES[dtype].itemsize
            entry[name] = data[at:at + size].view(TORCH_DTYPES[dtype]).clone().to(device)
            at += size
        for name, (value, dtype) in described["scalars"].items():
            entry[name] = torch.tensor(value, dtype=TORCH_DTYPES[dtype])
        if entry:
            state[shard_index] = entry
    groups, at = [], 0
    for settings, count in zip(plan["param_groups"], per_group, strict=True):
        groups.append({**settings, "params": list(range(at, at + count))})
        at += count
    return {"state": state, "param_groups": groups}


def own_bytes(buckets: Sequence[Bucket], optimizer: torch.optim.Optimizer,
              plan: dict[str, Any]) -> torch.Tensor:
    """This rank's slices of every per-element state, as one run of bytes (what `write_slice` takes)."""
    parts = []
    for flat, described in zip(buckets, plan["flats"], strict=True):
        state = optimizer.state.get(flat.shard, {})
        for name in described["names"]:
            parts.append(state[name].detach().to("cpu").reshape(-1).view(torch.uint8))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def file_entries(buckets: Sequence[Bucket], plan: dict[str, Any],
             shapes: Mapping[int, torch.Size]) -> dict[str, Entry]:
    tensors: dict[str, tuple[str, Sequence[int]]] = {}
    for flat, described in zip(buckets, plan["flats"], strict=True):
        for index in flat.partition.indices:
            for name, dtype in described["names"].items():
                tensors[entry_name(index, name)] = (dtype, list(shapes[index]))
            for name, (value, dtype) in described["scalars"].items():
                tensors[entry_name(index, name)] = (dtype, list(torch.tensor(value).shape))
    return layout(tensors)


def file_metadata(buckets: Sequence[Bucket], plan: dict[str, Any], group_sizes: Sequence[int],
              stage: int) -> dict[str, Any]:
    per_element = {f"{index}.{name}": True for flat, described in zip(buckets, plan["flats"],
                                                                      strict=True)
                   for index in flat.partition.indices for name in described["names"]}
    groups, at = [], 0
    for settings, size in zip(plan["param_groups"], group_sizes, strict=True):
        groups.append({**settings, "params": list(range(at, at + size))})
        at += size
    return {"param_groups": groups, "per_element": per_element, "zero_stage": stage,
            "partition": [p.record() for p in (bucket.partition for bucket in buckets)]}


def write_slice(writer: StateFileWriter, buckets: Sequence[Bucket], plan: dict[str, Any], rank: int,
            data: torch.Tensor) -> None:
    at = 0
    for flat, described in zip(buckets, plan["flats"], strict=True):
        for name, dtype in described["names"].items():
            itemsize = TORCH_DTYPES[dtype].itemsize
            values = data[at:at + flat.partition.shard_size * itemsize]
            at += flat.partition.shard_size * itemsize
            for piece in flat.partition.pieces(rank):
                run = values[piece.at * itemsize:(piece.at + piece.length) * itemsize]
                writer.write(entry_name(piece.index, name), piece.start, run.numpy().tobytes())
        if rank == 0:
            for name, (value, dtype) in described["scalars"].items():
                data_bytes = torch.tensor(value, dtype=TORCH_DTYPES[dtype]).reshape(-1).view(torch.uint8)
                for index in flat.partition.indices:
                    writer.write(entry_name(index, name), 0, data_bytes.numpy().tobytes())


def settings_of(param_groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A state dict's group settings without their parameters, JSON-ready (tensors as numbers)."""
    return [{k: (v.item() if isinstance(v, torch.Tensor) else list(v) if isinstance(v, tuple) else v)
             for k, v in group.items() if k != "params"} for group in param_groups]


def rank0_sends(data: torch.Tensor | None, to: int, rank: int, world: int) -> torch.Tensor:
    """Rank 0's `data` delivered to rank `to` alone (an alltoall in which only rank 0 sends, to one rank)."""
    if to == 0 or world == 1:
        return data if rank == 0 and data is not None else torch.empty(0, dtype=torch.uint8)
    tensor = data if rank == 0 and data is not None else torch.empty(0, dtype=torch.uint8)
    splits = torch.zeros(world, dtype=torch.int32)
    if rank == 0:
        splits[to] = tensor.numel()
    received = hvd.alltoall(tensor, splits=splits, name=f"hvdazure.zero.scatter.{to}")
    return received[0] if isinstance(received, tuple) else received


def to_rank0(data: torch.Tensor | None, sender: int, rank: int, world: int) -> torch.Tensor:
    """Rank `sender`'s `data` delivered to rank 0 alone (an alltoall in which one rank sends, to rank 0)."""
    if sender == 0 or world == 1:
        return data if rank == 0 and data is not None else torch.empty(0, dtype=torch.uint8)
    tensor = data if rank == sender and data is not None else torch.empty(0, dtype=torch.uint8)
    splits = torch.zeros(world, dtype=torch.int32)
    if rank == sender:
        splits[0] = tensor.numel()
    received = hvd.alltoall(tensor, splits=splits, name=f"hvdazure.zero.gather.{sender}")
    return received[0] if isinstance(received, tuple) else received
