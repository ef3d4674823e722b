"""What a checkpoint holds of a PyTorch model, optimizer and AMP scaler, and of a rank's torch RNGs.

A model's weights are saved under the uncompiled model's keys: torch.compile wraps a model in a module that
holds it as `_orig_mod`, whose state dict says `_orig_mod.weight` where the model says `weight`. Checkpoints
leave that part out and loads put it back where the model has it, so that compiled and eager builds of one
model load each other's checkpoints (and those written with the prefix before it was left out).
"""

from __future__ import annotations

import base64
import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import torch

from hvdazure.core.backend import FrameworkCheckpointContent
from hvdazure.core.optimizer_shards import STATE_FILE, StateFile
from hvdazure.torch.zero import ShardedOptimizer
from hvdazure.torch.zero_state import DictSource, FileSource

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
_COMPILED = "_orig_mod"  # the attribute torch.compile's wrapper (OptimizedModule) holds the model under


class TorchCheckpointContent(FrameworkCheckpointContent):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None, device: torch.device,
                 sharded: ShardedOptimizer | None = None) -> None:
        self.model, self.optimizer, self.scaler, self.device = model, optimizer, scaler, device
        self.sharded = sharded  # with zero_stage: the optimizer state is a slice per rank (torch/zero.py)
        self._staging = StagingBuffers()

    def nonfinite_weight(self) -> str | None:
        state = {name: t for name, t in model_state(self.model).items()
                 if isinstance(t, torch.Tensor) and t.is_floating_point()}
        if math.isfinite(float(nonfinite_probe(list(state.values())))):  # one read, not one per tensor
            return None
        return next(name for name, t in state.items() if not bool(torch.isfinite(t).all()))

    def collect(self) -> None:
        if self.sharded is not None:
            self.sharded.collect()

    def manifest_record(self) -> dict[str, Any]:
        return {} if self.sharded is None else self.sharded.layout_record()

    def save_files(self, copy: bool) -> dict[str, Callable[[BinaryIO], None]]:
        if self.sharded is not None:  # the state file `collect` streamed to rank 0: a copy by nature
            weights = model_state(self.model)
            if copy:
                weights = self._staging.copy(weights)
            return {MODEL_FILE: lambda file: save_without_zip_crc(weights, file),
                    STATE_FILE: self.sharded.spool_writer()}
        weights, optimizer_state = model_state(self.model), self.optimizer.state_dict()
        if copy:  # training goes on while a background thread writes: write a copy taken now
            weights, optimizer_state = self._staging.copy((weights, optimizer_state))
        return {MODEL_FILE: lambda file: save_without_zip_crc(weights, file),
                OPTIMIZER_FILE: lambda file: save_without_zip_crc(optimizer_state, file)}

    def load_files(self, paths: dict[str, str]) -> None:
        # weights_only: tensors and plain containers only, never arbitrary pickled objects. The model's
        # file is memory-mapped: load_state_dict copies it into the parameters, with no second copy in
        # memory. The optimizer's is read: Optimizer.load_state_dict keeps the tensors it is given, which
        # must not stay mapped to a file in a checkpoint directory that retention may delete.
        load_model_state(self.model, load_mapped(paths[MODEL_FILE], self.device))
        if self.sharded is not None:  # read lazily (memory-mapped) and scattered a slice at a time
            self.sharded.hold_for_scatter(
                FileSource(StateFile(paths[STATE_FILE])) if STATE_FILE in paths else
                DictSource(torch.load(paths[OPTIMIZER_FILE], map_location="cpu", mmap=True,
                                      weights_only=True), self.sharded.numels))
        elif STATE_FILE in paths:  # written with zero_stage 1 or 2: whole, as this run keeps it
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            self.optimizer.load_state_dict(FileSource(StateFile(paths[STATE_FILE])).full_state_dict(
                {i: p.numel() for i, p in enumerate(params)}, {i: p.shape for i, p in enumerate(params)}))
        else:
            self.optimizer.load_state_dict(torch.load(paths[OPTIMIZER_FILE], map_location=self.device,
                                                      weights_only=True))

    def state_dict(self) -> dict[str, Any]:
        return {"grad_scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])

    def save_rng(self) -> dict[str, Any]:
        cuda = [_encode(t) for t in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
        return {"torch": _encode(torch.get_rng_state()), "cuda": cuda}

    def load_rng(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(_decode(state["torch"]))
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_decode(s) for s in state["cuda"]])

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)


def original_module(model: torch.nn.Module) -> torch.nn.Module:
    """The model torch.compile wrapped (`model` itself when it is not compiled): the module whose parameters
    the optimizer holds and whose keys checkpoints use."""
    while isinstance(inner := getattr(model, _COMPILED, None), torch.nn.Module):
        model = inner
    return model


def without_compile_prefix(state: Mapping[str, Any]) -> dict[str, Any]:
    """A state dict with torch.compile's `_orig_mod.` left out of every key (`_orig_mod.fc.weight` and
    `fc._orig_mod.weight`, a compiled submodule's, are `fc.weight`); `state` itself when no key has it."""
    if not any(_COMPILED in key.split(".") for key in state):
        return state if isinstance(state, dict) else dict(state)
    plain: dict[str, Any] = OrderedDict((_uncompiled_key(key), value) for key, value in state.items())
    metadata = getattr(state, "_metadata", None)  # the modules' versions, which load_state_dict reads
    if metadata is not None:
        plain._metadata = OrderedDict(  # type: ignore[attr-defined]
            (_uncompiled_key(key), value) for key, value in metadata.items()
            if key.split(".")[-1] != _COMPILED)
    return plain


def model_state(model: torch.nn.Module) -> dict[str, Any]:
    """`model`'s state dict under the uncompiled model's keys (what a checkpoint's model file holds)."""
    return without_compile_prefix(original_module(model).state_dict())


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """`state` loaded into `model` (strictly: every key), whether either of them was compiled or not: each
    key is matched with the model's own under the uncompiled model's keys."""
    module = original_module(model)
    own = {_uncompiled_key(key): key for key in module.state_dict()}
    if not set(state) <= set(own.values()):  # else the keys are the model's own already
        state = OrderedDict((own.get(key, key), v) for key, v in without_compile_prefix(state).items())
    module.load_state_dict(state)


def _uncompiled_key(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != _COMPILED)


def nonfinite_probe(tensors: list[torch.Tensor]) -> torch.Tensor | float:
    """A number that is NaN or infinite exactly when one of `tensors` holds such a value, computed where they
    are, without a wait for the GPU. On a GPU their largest absolute value (a fused kernel per dtype); on
    the CPU, where that kernel is slow (1.5 ms for 400,000 values on this project's machine, against 30 us),
    the sum of their sums (in float32 at least), which finite values would overflow only past ~1e38."""
    if not tensors:
        return 0.0
    if tensors[0].device.type != "cpu":
        return torch.nn.utils.get_total_norm(tensors, norm_type=math.inf)
    return sum(float(t.sum(dtype=torch.float32 if t.element_size() < 4 else None)) for t in tensors)


def load_mapped(path: str, device: str | torch.device) -> Any:
    """torch.load(path) memory-mapped, or read where the filesystem cannot map files (FUSE mounts with direct
    I/O, as blob storage mounts may be, refuse mmap): the same tensors either way."""
    try:
        return torch.load(path, map_location=device, weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "unable to mmap" not in str(exc):
            raise
    return torch.load(path, map_location=device, weights_only=True)


class StagingBuffers:
    """CPU copies of state tensors for background writes, kept and reused from one save to the next.

    Copying into memory already in use costs a plain memcpy; a fresh copy of 100 MB also pays the page
    faults of new memory, about 8x as long here, all of it a training stall. The buffers are pinned when
    the source is on a GPU (fast device-to-host copies). They hold one copy of the state between saves;
    the checkpoint code writes one save at a time, so a save never overwrites buffers still being written.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def copy(self, value: Any) -> Any:
        """`value` (nested dicts, lists and tuples of tensors and plain values) with every tensor copied
        into its buffer; plain values are shared (the state dicts hold immutable numbers and strings)."""
        on_gpu: list[bool] = []
        copied = self._copy(value, (), on_gpu)
        if any(on_gpu):
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are done before anyone reads
        return copied

    def _copy(self, value: Any, path: tuple[Any, ...], on_gpu: list[bool]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy_tensor(value.detach(), path, on_gpu)
        if isinstance(value, dict):
            return {k: self._copy(v, (*path, k), on_gpu) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._copy(v, (*path, i), on_gpu) for i, v in enumerate(value))
        return value

    def _copy_tensor(self, tensor: torch.Tensor, path: tuple[Any, ...], on_gpu: list[bool]) -> torch.Tensor:
        if tensor.layout != torch.strided:  # sparse and other layouts: a fresh copy, as torch makes it
            return tensor.to("cpu", copy=True)
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            self._buffers[path] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        on_gpu.append(tensor.is_cuda)
        return buffer


_ZIP_CRC = threading.Lock()


def save_without_zip_crc(state: Any, file: BinaryIO) -> None:
    """torch.save without the CRC32 of each record in its zip file: torch.load never checks it, and the
    checkpoint manager hashes every byte of the file and verifies it before each load. The CRC costs about
    as much as the rest of torch.save (miniz's CRC32 runs at ~2 GB/s here)."""
    with _zip_crc_off():
        torch.save(state, file)


@contextlib.contextmanager
def _zip_crc_off() -> Iterator[None]:
    """torch's CRC setting is process-wide and read when torch.save opens its file: switch it off around
    our saves only (a torch.save by another thread at that instant also skips it; nothing reads it)."""
    from torch.utils.serialization import config

    with _ZIP_CRC:
        previous = config.save.compute_crc32
        config.save.compute_crc32 = False
        try:
            yield
        finally:
            config.save.compute_crc32 = previous


def _encode(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
