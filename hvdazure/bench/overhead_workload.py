"""The overhead benchmark's workload, the same for both frameworks (overhead_torch.py, overhead_tf.py): the
MLP's sizes, the batch and hyperparameters, the two variants timed, the clocks that time a block of steps
and what each framework's side offers the benchmark (OverheadSide). Imports no framework.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from hvdazure import Callback
from hvdazure.core.trainer import Trainer

BATCH_SIZE = 64  # per rank
FEATURES, HIDDEN, CLASSES = 256, 512, 10  # the MLP: FEATURES -> HIDDEN -> HIDDEN -> CLASSES
LR, LOG_EVERY = 0.01, 10
# The variants: Horovod's example loop, the binding's trainer, and the trainer with step_times off (what
# timing the step's phases costs: core/step_times.py)
HAND, TRAINER, UNTIMED = "hand-written", "trainer", "trainer, step_times off"
VARIANTS = (HAND, TRAINER, UNTIMED)


class BlockSchedule(NamedTuple):
    """How the variants are timed: `pairs` pairs of blocks (one block of each variant), each block
    `steps_per_block` steps."""

    pairs: int
    steps_per_block: int


def block_schedule(quick: bool) -> BlockSchedule:
    """20 pairs of 30-step blocks (--quick: 2 pairs of 6)."""
    return BlockSchedule(2, 6) if quick else BlockSchedule(20, 30)


class StepClock(Callback):
    """Wall time from one step's end to the next's (data loading, the step and every callback included)."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    def on_epoch_start(self, trainer: Any) -> None:
        self.mark = time.perf_counter()

    def on_step_end(self, trainer: Any) -> None:
        now = time.perf_counter()
        self.durations.append(now - self.mark)
        self.mark = now


class InStepTimer(Trainer):
    """Between a binding's Trainer and the core's (`class BenchTrainer(TorchTrainer, InStepTimer)`): the
    time of each step of the backend's `run_step`, the step itself, so that what the trainer does around
    it can be told apart. It wraps the backend the binding passes to the core Trainer. Framework-free: both
    benchmarks use it."""

    in_step_s: list[float]

    def __init__(self, config: Any = None, callbacks: Any = (), comm: Any = None, *, backend: Any) -> None:
        self.in_step_s = []
        run_step = backend.run_step

        def timed(*args: Any) -> float:
            start = time.perf_counter()
            try:
                return run_step(*args)
            finally:
                self.in_step_s.append(time.perf_counter() - start)

        backend.run_step = timed
        super().__init__(config, callbacks, comm, backend=backend)


class BlockTime(NamedTuple):
    """A block's seconds over its steps after the first, and of those the trainer's outside its backend's
    `run_step` (its bookkeeping; None for the hand-written loop)."""

    seconds: float
    outside_step_s: float | None


def time_after_first_step(durations: list[float], in_step_s: list[float] | None = None) -> BlockTime:
    """A block's time without its first step (per-block setup: a new DataLoader iterator, the tf.function's
    tracing), and, given the time of each step inside its backend's run_step, the time outside it over the
    same steps."""
    total = sum(durations[1:])
    return BlockTime(total, None if in_step_s is None else total - sum(in_step_s[1:]))


class OverheadSide(Protocol):
    """What a framework's side of the benchmark (overhead_torch, overhead_tf: modules) offers its ranks."""

    def block_runners(self, steps: int, batch_size: int) -> dict[str, Callable[[], BlockTime]]:
        """Start Horovod; per variant (VARIANTS), a function that trains one block of `steps` steps."""
        ...

    def slowest_rank(self, seconds: float) -> float:
        """The largest of every rank's `seconds` (a collective: every rank calls it)."""
        ...

    def rank(self) -> int: ...

    def world_size(self) -> int: ...
