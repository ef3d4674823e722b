"""FakeCuda: a test double of torch.cuda, at the torch boundary, for the machines the tests run on, which
have no GPU. No GPU runs under it: it answers the questions hvdazure's PyTorch binding asks torch.cuda (is
one available, how many, set this one, its memory peaks and utilization) with numbers the test chose, and
records what was asked, so that the binding's decisions and formatting can be checked without a device.
What a real GPU does with them (NCCL, kernels, memory) is not tested by it.

`install(monkeypatch)` puts it in place of those torch.cuda functions for a test (or, in a subprocess, with
`pytest.MonkeyPatch.context()`).
"""

from __future__ import annotations

from typing import Any

import torch

PATCHED = ("is_available", "device_count", "set_device", "current_device", "max_memory_allocated",
           "max_memory_reserved", "reset_peak_memory_stats", "utilization")


class FakeCuda:
    """`device_count` fake GPUs; `utilization` the percent NVML would report, None as without pynvml
    (torch.cuda.utilization raises ModuleNotFoundError then); `peaks` the (allocated, reserved) bytes each
    reading of the memory peaks returns, in turn (the last repeats)."""

    def __init__(self, device_count: int, utilization: float | None = None,
                 peaks: list[tuple[int, int]] | None = None) -> None:
        self.count, self._utilization = device_count, utilization
        self._peaks = list(peaks or [(0, 0)])
        self.current: int | None = None
        self.resets: list[int] = []  # the device of each reset_peak_memory_stats

    def install(self, monkeypatch: Any) -> FakeCuda:
        for name in PATCHED:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def set_device(self, device: int | torch.device) -> None:
        index = _index(device)
        if not 0 <= index < self.count:  # torch's own message for an index it does not have
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.current = index

    def current_device(self) -> int:
        return self.current or 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return self._peaks[0][0]

    def max_memory_reserved(self, device: Any = None) -> int:
        return self._peaks[0][1]

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.resets.append(_index(device))
        if len(self._peaks) > 1:
            self._peaks.pop(0)

    def utilization(self, device: Any = None) -> float:
        if self._utilization is None:
            raise ModuleNotFoundError("No module named 'pynvml'")
        return self._utilization


def _index(device: Any) -> int:
    if isinstance(device, torch.device):
        return device.index if device.index is not None else 0
    return 0 if device is None else int(device)
