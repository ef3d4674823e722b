"""A loss or gradients that become NaN or infinite: what the run does, in plain words, and what it says.

What counts: a step whose loss (training_step's, on any rank, for a micro-batch with samples) is NaN or
infinite, or whose gradients are after the allreduce, where one rank's NaN reaches every rank. Config field
`on_nan_loss` says what happens then:

- `stop` (the default): every rank stops together, at the next metric reduction (every `log_every` steps
  and at an epoch's end) or before the next checkpoint, whichever comes first, and the script ends with one
  line and exit status 1, no traceback (`NonFiniteError`): the first such step, the rank(s) whose loss it
  was (or that the gradients were, the loss being finite everywhere), the step the run stopped at, the last
  step with finite weights and the newest checkpoint that holds finite weights. The weights of the steps in
  between are not finite: no checkpoint of them is written, not at the stop and not on the way out.
- `skip`: a step whose allreduced gradients are not finite is not applied (weights and optimizer state stay
  as they were), the way fp16 loss scaling skips an overflowing step, by the same loss scaler (PyTorch's
  GradScaler, Keras's LossScaleOptimizer), held at a scale of 1 outside fp16: one mechanism, not two.
  Skipped steps are counted, each log interval that skipped some says so, and the loss means leave out
  losses that are not finite. fp16's own overflow skips are counted the same way, in both policies.

How it is found without making the host wait for the GPU at every step: each rank keeps a small record on
its device (`RECORD`), updated by device operations inside the step (PyTorch: `torch.where`; TensorFlow:
inside the compiled step): the first step whose loss was not finite and that loss, the first step whose
allreduced gradients were not finite, and the steps skipped. The record travels in the log interval's one
fused collective beside the metric sums (core/metrics.py's flags), so every rank reads every rank's record
at the same step and all stop together; the loop also reduces before every checkpoint, so no checkpoint is
written after a non-finite step that went unread. Its cost is a few scalar operations per micro-batch and
one pass over the gradients per step, a read with no write (benchmarks/RESULTS.md has the measurements).
`skip` also reads each loss on the host (a wait for the GPU per micro-batch, as fp16's GradScaler waits per
step).

Independently of the record, rank 0 checks the model's weights (one isfinite reduction) before it writes a
checkpoint's manifest, for every save, the emergency save after an error included: a checkpoint of
weights that are not finite is never written, so `latest` and `best` always name finite ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from hvdazure.core.errors import UserError
from hvdazure.core.rank_logging import logger

# A rank's record, in this order (0: none yet; steps are counted from 1 over the run, as `state.step`)
FIRST_LOSS_STEP, FIRST_LOSS, FIRST_GRADIENTS_STEP, SKIPPED_STEPS = range(4)
RECORD = ("first_loss_step", "first_loss", "first_gradients_step", "skipped_steps")
NO_RECORD = (0.0, 0.0, 0.0, 0.0)
POLICIES = ("stop", "skip")


class NonFiniteError(UserError):
    """Training stopped on every rank because a loss or the gradients became NaN or infinite; the one line
    says where, and which checkpoint holds the last finite weights. Exit status 1: the run failed, the input
    was readable (a sweep counts the trial as diverged)."""

    exit_status = 1


def what_went_wrong(rows: Sequence[Sequence[float]]) -> str | None:
    """What every rank's record (in rank order) shows, for `stop`: the first non-finite loss (its value and
    the ranks it was on), or the first step whose allreduced gradients were not finite; None: nothing."""
    losses = [(row[FIRST_LOSS_STEP], rank, row[FIRST_LOSS]) for rank, row in enumerate(rows)
              if row[FIRST_LOSS_STEP]]
    gradients = [row[FIRST_GRADIENTS_STEP] for row in rows if row[FIRST_GRADIENTS_STEP]]
    if losses and (not gradients or min(losses)[0] <= min(gradients)):
        step = min(losses)[0]
        first = [(rank, value) for at, rank, value in losses if at == step]
        ranks = ", ".join(str(rank) for rank, _ in first)
        values = sorted({_value_word(value) for _, value in first})
        return (f"training_step returned a non-finite loss ({' and '.join(values)}) at step {step:.0f} on "
                f"rank{'s' if len(first) > 1 else ''} {ranks}")
    if gradients:
        return (f"gradients became non-finite after the allreduce at step {min(gradients):.0f} (the loss "
                "was finite on every rank)")
    return None


def first_step(rows: Sequence[Sequence[float]]) -> int:
    """The first step any rank recorded as not finite (0: none)."""
    steps = [row[i] for row in rows for i in (FIRST_LOSS_STEP, FIRST_GRADIENTS_STEP) if row[i]]
    return int(min(steps)) if steps else 0


def stop_line(what: str, first: int, stopped_at: int, newest_finite: str | None,
              checkpointing: bool) -> str:
    """The one line a `stop` ends the script with."""
    if not checkpointing:
        where = "no checkpoint was written (checkpoint_dir is not set)"
    elif newest_finite is None:
        where = "no checkpoint of this run holds finite weights"
    else:
        where = f"the newest finite checkpoint is {newest_finite}"
    last = f"the weights of step {first - 1} were the last finite ones" if first > 1 else \
        "the initial weights were the last finite ones"
    return (f"{what}; stopped all ranks at step {stopped_at} ({last}); {where}. Lower the lr, clip the "
            "gradients (grad_clip_norm), or set on_nan_loss: skip to skip such steps")


def skipped_steps(rows: Sequence[Sequence[float]]) -> int:
    """Steps skipped so far (the ranks skip the same steps: their allreduced gradients are the same)."""
    return int(max(row[SKIPPED_STEPS] for row in rows)) if rows else 0


class NonFiniteWatch:
    """The loop's side of the policy: reads every rank's record after each reduction; `stop` raises
    NonFiniteError (on every rank: the rows are the same everywhere), `skip` has rank 0 log the steps
    skipped since the last reduction."""

    def __init__(self, policy: str, is_main: bool, loss_scaling: bool = False) -> None:
        # loss_scaling (fp16): overflow skips are how a dynamic loss scale finds its level, not a fault
        self.policy, self.is_main, self.loss_scaling = policy, is_main, loss_scaling
        self.skipped = 0  # steps skipped in this run, as far as the records have been read

    def check(self, rows: Sequence[Sequence[float]], step: int, checkpoints: NewestFinite | None) -> None:
        """Act on the records read at optimizer step `step` (rows: every rank's, in rank order), every rank
        at the same point; `checkpoints`: the run's (None: checkpointing is off)."""
        skipped = skipped_steps(rows)
        if skipped > self.skipped and self.is_main:
            count, seen = skipped - self.skipped, f"up to step {step} ({skipped} in this run so far"
            if self.loss_scaling:
                logger.info(f"fp16 loss scaling skipped {count} step(s) whose scaled gradients overflowed, "
                            f"{seen}; the loss scale is lowered after each)")
            else:
                logger.warning(f"skipped {count} step(s) whose gradients were not finite, {seen}; config "
                               "field on_nan_loss)")
        self.skipped = max(self.skipped, skipped)
        what = what_went_wrong(rows) if self.policy == "stop" else None
        if what is not None:
            newest = checkpoints.newest_finite_after_pending() if checkpoints is not None else None
            raise NonFiniteError(stop_line(what, first_step(rows), step, newest, checkpoints is not None))


class NewestFinite(Protocol):
    """What the watch asks of the run's checkpoints (core/checkpoint/trainer_checkpoints.py)."""

    def newest_finite_after_pending(self) -> str | None:
        """The newest checkpoint of the run that holds finite weights, once a write in progress has ended
        (every rank calls it at the same point); None: none."""


def _value_word(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"
