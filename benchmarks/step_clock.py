"""A callback that times every training step, for the benchmarks."""

from __future__ import annotations

import time

from hvdazure import Callback


class StepClock(Callback):
    """Wall time from one step's end to the next's: data loading, the step and every other callback's work
    (a checkpoint, say: user callbacks run after the built-in ones) are included."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    def on_epoch_start(self, trainer) -> None:
        self.mark = time.perf_counter()

    def on_step_end(self, trainer) -> None:
        now = time.perf_counter()
        self.durations.append(now - self.mark)
        self.mark = now
