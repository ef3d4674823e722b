"""PyTorch's side of profiler traces (core/profiling.py says which steps, on which rank, where) and of the
device's numbers in the step times (core/step_times.py): torch.profiler and torch.cuda."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from hvdazure.core.profiling import ProfilerTrace, StepProfiler


class TorchProfiler(StepProfiler):
    """torch.profiler over the steps the core names: the CPU's activities, and CUDA's on a GPU; each step a
    `ProfilerStep#N` range, as torch.profiler's own schedule marks them (with the run's step numbers); the
    trace written as a Chrome trace, `<label>.pt.trace.json`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._profile: Any = None
        self._step: Any = None
        self._path = Path()

    def start(self, directory: Path, label: str) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._path = directory / f"{label}.pt.trace.json"
        self._profile = torch.profiler.profile(activities=activities)
        self._profile.start()

    def begin_step(self, step: int) -> None:
        self._step = torch.profiler.record_function(f"ProfilerStep#{step}")
        self._step.__enter__()

    def end_step(self) -> None:
        self._step.__exit__(None, None, None)

    def stop(self) -> ProfilerTrace:
        self._profile.stop()
        partial = self._path.with_name(self._path.name + ".partial")
        self._profile.export_chrome_trace(str(partial))
        os.replace(partial, self._path)
        return ProfilerTrace(str(self._path), "chrome")


class CudaStats:
    """One GPU's peak memory allocated by tensors and reserved by PyTorch's caching allocator since the last
    reading (then reset), and its utilization (NVML's, through torch.cuda.utilization; NaN where pynvml is
    missing or NVML fails: asked once, then no more). Reads counters only: nothing waits for the GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._utilization_known = True

    def __call__(self) -> tuple[float, float, float]:
        peak = float(torch.cuda.max_memory_allocated(self.device))
        reserved = float(torch.cuda.max_memory_reserved(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak, reserved, self._utilization()

    def _utilization(self) -> float:
        if self._utilization_known:
            try:
                return float(torch.cuda.utilization(self.device))
            except Exception:  # no pynvml (ModuleNotFoundError), an NVML error: not shown
                self._utilization_known = False
        return math.nan
