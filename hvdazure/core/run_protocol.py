"""`Run`: what hvdazure's own callbacks (the LR schedule, progress, early stopping, the loggers, periodic
checkpoints, the preemption watcher) need of the run they are part of. The training loop
(core/training_loop.py) implements it and gives itself to them, not the user's trainer: a subclass of the
trainer may override any public name (`log`, `set_lr`, `save_checkpoint`, `finished`, ...), and what it
does there must never change what the built-in parts do. The user's own callbacks keep receiving the
trainer (core/callbacks.py's Callback).

A protocol, not the loop's class, so that the built-in parts depend on this small surface only and sit below
the loop and the trainer (the acyclic import contract in pyproject.toml).
"""

from __future__ import annotations

from typing import Protocol

from hvdazure.core.config import TrainConfig
from hvdazure.core.lr import LRSchedule
from hvdazure.core.state import TrainState
from hvdazure.core.step_times import Breakdown


class Run(Protocol):
    """The running training as a built-in callback sees it (from `on_train_start` on)."""

    @property
    def state(self) -> TrainState:
        """Where training is, its latest reduced metrics and history; `state.request_stop` asks to stop."""

    @property
    def config(self) -> TrainConfig:
        """The run's settings."""

    @property
    def rank(self) -> int:
        """This rank's place in the job."""

    @property
    def local_rank(self) -> int:
        """This rank's place on its node."""

    @property
    def world_size(self) -> int:
        """The number of ranks training."""

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step across all ranks."""

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in an epoch at this world size."""

    @property
    def schedule(self) -> LRSchedule:
        """The LR schedule, scaled for the global batch."""

    @property
    def schedule_step(self) -> int:
        """The optimizer step the LR schedule is at."""

    @property
    def finished(self) -> bool:
        """Whether training has reached its end (a resume of a run that has ended: already at the start)."""

    @property
    def last_times(self) -> Breakdown | None:
        """The last log interval's phase times, reduced over ranks; None before the first (or untimed)."""

    def log(self, message: str) -> None:
        """Log a line (shown for rank 0; other ranks log errors only)."""

    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate."""

    def save_checkpoint(self, reason: str = "manual", wait: bool = True) -> str | None:
        """Checkpoint now, on every rank at the same step; the name once written (wait=True)."""

    def request_checkpoint_and_exit(self, reason: str) -> None:
        """Make every rank save a checkpoint at the next step and exit 143 (from any thread of any rank)."""
