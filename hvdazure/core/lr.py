"""Learning-rate math: scaling for the global batch, Goyal et al. (2017) warmup, and the schedule after it.

Everything is counted in optimizer steps (not micro-batches, not per process). The scaled LR depends only on
the global batch and base_batch_size: with an explicit base_batch_size, the same global batch gets the same
LR whatever the world size; the default base (the per-worker batch_size) gives Horovod's `lr x size`. So,
with the defaults, 2 ranks of batch b train at twice the LR of 1 process of batch 2b (its base is 2b): the
first log line says which LR a run trains at and how it was scaled (`describe_lr`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from hvdazure.core.config import TrainConfig


def scaled_lr(lr: float, global_batch_size: int, base_batch_size: int, scaling: str) -> float:
    """The LR for `global_batch_size`, given `lr` tuned for `base_batch_size` (linear or sqrt rule)."""
    ratio = global_batch_size / base_batch_size
    if scaling == "linear":
        return lr * ratio
    if scaling == "sqrt":
        return lr * math.sqrt(ratio)
    if scaling == "none":
        return lr
    raise ValueError(f"lr_scaling must be none, linear or sqrt, got {scaling!r}")


def describe_lr(config: TrainConfig, world_size: int, schedule: LRSchedule) -> str:
    """How the run's LR came about, for the first log line: the LR after warmup, the rule and the two batches
    it was scaled by (`lr 0.4 = 0.2 x 64/32, linear scaling from base_batch_size 32`), and where the base
    came from when it was not set; then the warmup and the schedule, if any."""
    c, peak = config, schedule.peak_lr
    base, batch = c.effective_base_batch_size, c.global_batch_size(world_size)
    default = " (= batch_size: base_batch_size is not set)" if c.base_batch_size is None else ""
    if c.lr_scaling == "none":
        line = f"lr {peak:.6g}, not scaled for the global batch {batch} (lr_scaling none)"
    else:
        ratio = f"{batch}/{base}" if c.lr_scaling == "linear" else f"sqrt({batch}/{base})"
        line = (f"lr {peak:.6g} = {c.lr:.6g} x {ratio}, {c.lr_scaling} scaling from base_batch_size "
                f"{base}{default}")
    if schedule.warmup_steps:
        line += f"; warmup from {schedule.start_lr:.6g} over {schedule.warmup_steps} steps"
    if schedule.schedule == "cosine":
        line += f"; then cosine decay to {schedule.min_lr:.6g}"
    elif schedule.schedule == "step":
        line += f"; then x {schedule.step_gamma:g} every {schedule.step_size_epochs} epoch(s)"
    return line


def warmup_epochs_to_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    """Optimizer steps covering `warmup_epochs` epochs, rounded up (never 0 when warmup is asked for).

    The product is taken on the decimal value the user wrote (1.1, not 1.100000000000000088...): in binary
    floating point 1.1 x 50 is 55.000000000000007, which would round up to 56."""
    return math.ceil(Fraction(repr(warmup_epochs)) * steps_per_epoch)


@dataclass(frozen=True)
class LRSchedule:
    """LR as a function of the optimizer step: warmup from `start_lr` to `peak_lr`, then the schedule."""

    start_lr: float
    peak_lr: float
    warmup_steps: int
    total_steps: int
    steps_per_epoch: int
    schedule: str = "constant"
    min_lr: float = 0.0
    step_size_epochs: int = 1
    step_gamma: float = 0.1

    @classmethod
    def from_config(cls, config: TrainConfig, world_size: int, steps_per_epoch: int) -> LRSchedule:
        """The schedule `config` asks for with `world_size` ranks and this many optimizer steps per epoch."""
        peak = scaled_lr(config.lr, config.global_batch_size(world_size), config.effective_base_batch_size,
                         config.lr_scaling)
        total = config.epochs * steps_per_epoch
        if config.max_steps is not None:
            total = min(total, config.max_steps)
        warmup = config.warmup_steps or warmup_epochs_to_steps(config.warmup_epochs, steps_per_epoch)
        return cls(start_lr=config.lr, peak_lr=peak, warmup_steps=warmup, total_steps=total,
                   steps_per_epoch=steps_per_epoch, schedule=config.schedule,
                   min_lr=config.min_lr * peak / config.lr, step_size_epochs=config.step_size_epochs,
                   step_gamma=config.step_gamma)

    def lr_at(self, step: int) -> float:
        """LR for optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.start_lr + (self.peak_lr - self.start_lr) * step / self.warmup_steps
        if self.schedule == "constant":
            return self.peak_lr
        if self.schedule == "cosine":
            span = max(1, self.total_steps - self.warmup_steps)
            progress = min(1.0, (step - self.warmup_steps) / span)
            return self.min_lr + (self.peak_lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
        if self.schedule == "step":
            decays = (step // self.steps_per_epoch) // self.step_size_epochs
            return self.peak_lr * self.step_gamma**decays
        raise ValueError(f"schedule must be constant, cosine or step, got {self.schedule!r}")
