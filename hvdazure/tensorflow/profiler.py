"""TensorFlow's side of profiler traces (core/profiling.py says which steps, on which rank, where) and of the
device's numbers in the step times (core/step_times.py): tf.profiler and tf.config's memory statistics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import tensorflow as tf

from hvdazure.core.profiling import ProfilerTrace, StepProfiler


class TensorFlowProfiler(StepProfiler):
    """TensorFlow's profiler over the steps the core names, each step marked with the run's step number (what
    TensorBoard's Profile tab reads its step times from). TensorFlow names the trace itself: a run folder
    `plugins/profile/<time>/` of the directory, holding `<host>.xplane.pb`."""

    def __init__(self) -> None:
        self._step: Any = None
        self._directory = Path()

    def start(self, directory: Path, label: str) -> None:
        self._directory = directory
        tf.profiler.experimental.start(str(directory))

    def begin_step(self, step: int) -> None:
        self._step = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
        self._step.__enter__()

    def end_step(self) -> None:
        self._step.__exit__(None, None, None)

    def stop(self) -> ProfilerTrace:
        tf.profiler.experimental.stop()
        runs = self._directory.glob("plugins/profile/*/*.xplane.pb")
        written = max(runs, key=lambda path: path.stat().st_mtime_ns)  # this one: the newest
        return ProfilerTrace(str(written), "tensorboard")


def gpu_stats() -> tuple[float, float, float]:
    """This rank's GPU (its only visible one: Horovod's ranks each see their own): the peak memory TensorFlow
    allocated since the last reading, then reset; neither reserved memory nor utilization (TensorFlow
    reports neither)."""
    try:
        peak = float(tf.config.experimental.get_memory_info("GPU:0")["peak"])
        tf.config.experimental.reset_memory_stats("GPU:0")
    except (ValueError, RuntimeError, tf.errors.OpError):  # a device TensorFlow keeps no statistics of
        return math.nan, math.nan, math.nan
    return peak, math.nan, math.nan
