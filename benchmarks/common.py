"""What the benchmarks share: a step timer and the JSON report."""

from __future__ import annotations

import json
import time
from pathlib import Path

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


def write_result(path: Path, result: dict) -> None:
    """Write a benchmark's result as JSON (creating its folder) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
