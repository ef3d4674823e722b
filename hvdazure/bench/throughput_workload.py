"""The throughput benchmark's workload, the same for both frameworks (throughput_torch.py, throughput_tf.py):
the batch schedule, the timer of batches of steps and what each framework's side offers the benchmark
(ThroughputSide); the models are models.py's. Imports no framework.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from hvdazure import Callback, TrainConfig
from hvdazure.bench.models import LR, MODELS


class BatchSchedule(NamedTuple):
    """What a run trains: `warmup` steps, then `batches` timed batches of `steps_per_batch` steps each."""

    warmup: int
    batches: int
    steps_per_batch: int

    @property
    def steps(self) -> int:
        return self.warmup + self.batches * self.steps_per_batch


def batch_schedule(quick: bool) -> BatchSchedule:
    """10 warm-up steps, 10 timed batches of 10 steps (--quick: 2, then 3 of 2)."""
    return BatchSchedule(2, 3, 2) if quick else BatchSchedule(10, 10, 10)


def batch_size(model: str, quick: bool) -> int:
    """The batch per rank (--quick: a quarter)."""
    return MODELS[model].batch // (4 if quick else 1)


def train_config(batch_size: int, schedule: BatchSchedule) -> TrainConfig:
    """One epoch (the data hold exactly the schedule's steps), metrics reduced once per timed batch."""
    return TrainConfig(epochs=1, batch_size=batch_size, lr=LR, log_every=schedule.steps_per_batch,
                       progress_bar=False)


class BatchTimer(Callback):
    """After `warmup` steps, the samples per second of this rank over each batch of `steps_per_batch` steps;
    `synchronize` (if given) waits for the device to finish the batch's work before the clock is read."""

    def __init__(self, warmup: int, steps_per_batch: int, batch_size: int,
                 synchronize: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.warmup, self.steps_per_batch, self.batch_size = warmup, steps_per_batch, batch_size
        self.synchronize, self.clock = synchronize, clock
        self.steps, self.mark = 0, 0.0
        self.rates: list[float] = []

    def on_step_end(self, trainer: Any) -> None:
        self.steps += 1
        done = self.steps - self.warmup
        if done < 0 or done % self.steps_per_batch:
            return
        if self.synchronize is not None:
            self.synchronize()
        now = self.clock()
        if done > 0:
            self.rates.append(self.steps_per_batch * self.batch_size / (now - self.mark))
        self.mark = now


class ThroughputSide(Protocol):
    """What a framework's side of the benchmark (the modules throughput_torch, throughput_tf) offers its
    ranks."""

    def rates_per_rank(self, model: str, batch_size: int, schedule: BatchSchedule,
                       ) -> tuple[list[list[float]] | None, int]:
        """Train `model` through the framework's trainer; every rank's samples/s per timed batch (on rank 0,
        None elsewhere) and the world size."""
        ...
