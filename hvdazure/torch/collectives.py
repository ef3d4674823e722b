"""The core's collectives (core/backend.py) on `horovod.torch`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from hvdazure.core.backend import Collectives, horovod_controller, split_rows


class TorchCollectives(Collectives):
    def __init__(self, device: torch.device) -> None:
        super().__init__(hvd.rank(), hvd.size(), hvd.local_rank(), horovod_controller(hvd))
        self.device = device

    def allgather_floats(self, values: Sequence[Any]) -> list[list[float]]:
        # Each row travels with its length in front, so one allgather of rows of any lengths suffices.
        row = self._vector([len(values), *values])
        return split_rows(hvd.allgather(row, name="hvdazure.rows").tolist())

    def allreduce_sum_async(self, values: Sequence[Any], name: str) -> Callable[[], list[float]]:
        """Start an elementwise sum across ranks; the returned function waits for it (during the step)."""
        handle = hvd.allreduce_async(self._vector(values), op=hvd.Sum, name=f"hvdazure.{name}")
        return lambda: hvd.synchronize(handle).tolist()

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        size = hvd.broadcast(torch.tensor([len(data) if data is not None else 0]), 0, name="hvdazure.bytes.n")
        if int(size) == 0:
            return b""
        buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None
                  else torch.empty(int(size), dtype=torch.uint8))
        return hvd.broadcast(buffer, 0, name="hvdazure.bytes").numpy().tobytes()

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        sizes = hvd.allgather(torch.tensor([len(data)]), name="hvdazure.gather.n").tolist()
        joined = hvd.allgather(torch.frombuffer(bytearray(data), dtype=torch.uint8), name="hvdazure.gather")
        blob = joined.numpy().tobytes()
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return [blob[offsets[i] : offsets[i + 1]] for i in range(len(sizes))]

    def _vector(self, values: Sequence[Any]) -> torch.Tensor:
        """`values` (numbers or scalar tensors) as one float64 vector on the device; numbers read on the host
        make it in one operation, not one per value."""
        if all(isinstance(v, int | float) for v in values):
            return torch.tensor(values, dtype=torch.float64, device=self.device)
        return torch.stack([self._scalar(v) for v in values])

    def _scalar(self, value: Any) -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float64, device=self.device).detach().reshape(())
