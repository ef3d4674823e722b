"""What a checkpoint holds of a PyTorch model, optimizer and AMP scaler, and of a rank's torch RNGs."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, BinaryIO

import torch

from hvdazure.core.binding import FrameworkState

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"


class TorchState(FrameworkState):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None, device: torch.device) -> None:
        self.model, self.optimizer, self.scaler, self.device = model, optimizer, scaler, device

    def save_files(self) -> dict[str, Callable[[BinaryIO], None]]:
        # copies taken now, on the CPU: training may go on while a background thread writes them
        model_state = _cpu_copy(self.model.state_dict())
        optimizer_state = _cpu_copy(self.optimizer.state_dict())
        return {MODEL_FILE: lambda file: torch.save(model_state, file),
                OPTIMIZER_FILE: lambda file: torch.save(optimizer_state, file)}

    def load_files(self, paths: dict[str, str]) -> None:
        # weights_only: tensors and plain containers only, never arbitrary pickled objects. Read from the
        # (verified) files: memory holds the loaded tensors once, not also the file's bytes.
        for name, target in ((MODEL_FILE, self.model), (OPTIMIZER_FILE, self.optimizer)):
            target.load_state_dict(torch.load(paths[name], map_location=self.device, weights_only=True))

    def save_extra(self) -> dict[str, Any]:
        return {"grad_scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_extra(self, state: dict[str, Any]) -> None:
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


def _encode(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _cpu_copy(value: Any) -> Any:
    """A copy of a (nested) state dict whose tensors are fresh CPU tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_copy(v) for v in value)
    return value
