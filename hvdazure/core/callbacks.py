"""Callbacks: features of the training loop written against its named events.

Events, in order: on_train_start, then per epoch on_epoch_start, per optimizer step on_step_begin and
on_step_end, then on_eval_end (when an evaluation ran) and on_epoch_end, and finally on_train_end.
A callback reads `trainer.state` (a TrainState) and `trainer.config`; decisions that affect every rank
are made from reduced values (identical on all ranks) or through `state.request_stop`.

The user's callbacks (`Callback`) are given the user's trainer. hvdazure's own (`BuiltinCallback`: the LR
schedule, progress, early stopping, the loggers, periodic checkpoints, the preemption watcher) are given the
run instead (core/run_protocol.py's `Run`, which the loop implements), so that what a subclass of the trainer
overrides (`log`, `set_lr`, `save_checkpoint`, ...) never changes what they do.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from hvdazure.core.config import TrainConfig
from hvdazure.core.lr import LRSchedule, describe_lr
from hvdazure.core.progress_display import TERMINAL_ENV, display_width, epoch_bar
from hvdazure.core.run_protocol import Run


class Callback:
    """Override the events you need; each is given `trainer`, your trainer (the Trainer subclass training).
    `main_only` callbacks run on rank 0 only (loggers)."""

    main_only = False

    def on_train_start(self, trainer: Any) -> None:
        """Once, after Horovod has started, the state is broadcast and any checkpoint is resumed."""

    def on_epoch_start(self, trainer: Any) -> None:
        """At the start of every epoch (a resumed epoch included)."""

    def on_step_begin(self, trainer: Any) -> None:
        """Before every optimizer step."""

    def on_step_end(self, trainer: Any) -> None:
        """After every optimizer step; `trainer.state.metrics_reduced` tells whether the interval's metrics
        were just reduced over the ranks (every `log_every` steps)."""

    def on_eval_end(self, trainer: Any) -> None:
        """After an evaluation: `trainer.state.eval_metrics` holds its results, the same on every rank."""

    def on_epoch_end(self, trainer: Any) -> None:
        """At the end of every epoch, after its evaluation; `trainer.state.history[-1]` is its record."""

    def on_train_end(self, trainer: Any) -> None:
        """Once, when training ends, however it ends (the last epoch, `max_steps`, a stop)."""

    def state_dict(self) -> dict[str, Any]:
        """What this callback needs to resume exactly (e.g. early stopping's best value)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, on resume."""


class BuiltinCallback(Callback):
    """hvdazure's own callbacks: each event is given the run (core/run_protocol.py's `Run`, the loop), not the
    user's trainer, so that a trainer subclass's own `log`, `set_lr`, `save_checkpoint` or `finished` never
    replaces what they call. The loop tells them apart from the user's by this class (TrainingLoop._emit)."""

    def on_train_start(self, run: Run) -> None:
        """Once, after Horovod has started, the state is broadcast and any checkpoint is resumed."""

    def on_epoch_start(self, run: Run) -> None:
        """At the start of every epoch (a resumed epoch included)."""

    def on_step_begin(self, run: Run) -> None:
        """Before every optimizer step."""

    def on_step_end(self, run: Run) -> None:
        """After every optimizer step."""

    def on_eval_end(self, run: Run) -> None:
        """After an evaluation."""

    def on_epoch_end(self, run: Run) -> None:
        """At the end of every epoch, after its evaluation."""

    def on_train_end(self, run: Run) -> None:
        """Once, when training ends, however it ends."""


class LRScheduleCallback(BuiltinCallback):
    """Sets the LR of every optimizer step from the run's schedule: warmup, then the configured schedule."""

    def __init__(self) -> None:
        self._applied: float | None = None

    def on_step_begin(self, run: Run) -> None:
        lr = run.schedule.lr_at(run.schedule_step)
        if lr != self._applied:  # a constant LR is set once, not every step
            run.set_lr(lr)
            self._applied = lr
        run.state.lr = lr


class EarlyStopping(BuiltinCallback):
    """Stops when `monitor` has not improved by `min_delta` for `patience` evaluations."""

    def __init__(self, monitor: str, mode: str = "min", patience: int = 3, min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.best: float | None = None
        self.bad_evaluations = 0

    def on_eval_end(self, run: Run) -> None:
        metrics = {**{f"eval_{k}": v for k, v in run.state.eval_metrics.items()},
                   **{f"train_{k}": v for k, v in run.state.train_metrics.items()}}
        if self.monitor not in metrics:
            raise KeyError(f"early stopping monitors {self.monitor!r}, but the metrics are "
                           f"{', '.join(sorted(metrics))}")
        value = metrics[self.monitor]
        if not math.isnan(value) and (self.best is None or self._improved(value, by=self.min_delta)):
            self.best, self.bad_evaluations = value, 0
            return
        self.bad_evaluations += 1
        if self.bad_evaluations >= self.patience:
            evaluations = f"{self.patience} evaluation{'' if self.patience == 1 else 's'}"
            run.state.request_stop(f"early stopping: {self.monitor} did not improve for {evaluations} "
                                   f"({self._why_not_better(value)})")

    def _improved(self, value: float, by: float) -> bool:
        """Whether `value` is better than the best by more than `by`."""
        assert self.best is not None
        if self.mode == "min":
            return value < self.best - by
        return value > self.best + by

    def _why_not_better(self, value: float) -> str:
        """Why the last `value` was no improvement, in the stop reason: a value better than the best, but
        by less than `min_delta`, reads as one that improved unless it is said."""
        if self.best is None:
            return f"every value was {value:.6g}"
        if not math.isnan(value) and self._improved(value, by=0.0):
            return (f"{value:.6g} is better than the best {self.best:.6g} by less than min_delta "
                    f"{self.min_delta:g}")
        return f"best {self.best:.6g}"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evaluations": self.bad_evaluations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_evaluations = state["best"], state["bad_evaluations"]


def format_metrics(metrics: dict[str, float]) -> str:
    """`name value` pairs for a log line: counts as integers, everything else to 4 significant digits."""
    return " ".join(f"{k} {v}" if isinstance(v, int) else f"{k} {v:.4g}" for k, v in metrics.items())


def training_line(config: TrainConfig, world_size: int, steps_per_epoch: int, schedule: LRSchedule) -> str:
    """The first line of a run: how many ranks, the global batch and what makes it, and the LR it trains at
    with how it was scaled (core/lr.py's describe_lr), so that two runs' LRs can be compared at a glance."""
    accumulated = f" x {config.grad_accum_steps} grad_accum_steps" if config.grad_accum_steps > 1 else ""
    ranks = f"{world_size} rank{'' if world_size == 1 else 's'}"
    return (f"training on {ranks}: global batch {config.global_batch_size(world_size)} (batch_size "
            f"{config.batch_size} x {ranks}{accumulated}), {steps_per_epoch} steps per epoch; "
            f"{describe_lr(config, world_size, schedule)}")


def _max_steps_reached(run: Run) -> bool:
    return run.config.max_steps is not None and run.state.step >= run.config.max_steps


def _ending_field(run: Run) -> str:
    """The config field that ended a run that has ended: max_steps or epochs."""
    return "max_steps" if _max_steps_reached(run) else "epochs"


def _ended_by(run: Run) -> str:
    """What a run that has ended has done: its max_steps, or its epochs."""
    if _max_steps_reached(run):
        return f"taken its {run.config.max_steps} steps (max_steps)"
    return f"trained its {run.config.epochs} epochs"


class ProgressLogger(BuiltinCallback):
    """Rank 0's progress: on a terminal (its own, or that of `hvdazure run`) a tqdm bar per epoch, redrawn in
    place and replaced by the epoch's line when it ends (core/progress_display.py); elsewhere (logs, pipes) a
    line per log interval."""

    main_only = True

    def __init__(self, use_bar: bool | None = None) -> None:
        width = display_width(os.environ, sys.stderr)  # a terminal's, this process's or `hvdazure run`'s
        self.use_bar = width is not None if use_bar is None else use_bar
        self._width = width or 80
        self._through_hvdazure_run = bool(os.environ.get(TERMINAL_ENV))
        self.bar: Any = None
        self._mark: tuple[float, int] = (0.0, 0)

    def on_train_start(self, run: Run) -> None:
        self._mark = (time.perf_counter(), run.state.samples_seen)
        if run.finished:  # a resume of a run that has ended: say so, rather than end in silence
            run.log(f"nothing to train: the run has {_ended_by(run)} already (step "
                    f"{run.state.step}); raise {_ending_field(run)} to train further")
            return
        run.log(training_line(run.config, run.world_size, run.steps_per_epoch, run.schedule))

    def on_epoch_start(self, run: Run) -> None:
        if self.use_bar:  # redrawn in place; closed, it leaves nothing: the epoch's line takes its place
            self.bar = epoch_bar(sys.stderr, self._width, self._through_hvdazure_run, run.steps_per_epoch,
                                 run.state.step_in_epoch,
                                 f"epoch {run.state.epoch + 1}/{run.config.epochs}")

    def on_step_end(self, run: Run) -> None:
        s = run.state
        if self.bar is not None:
            self.bar.update(1)
        if not s.metrics_reduced:
            return
        now, samples = time.perf_counter(), s.samples_seen
        rate = (samples - self._mark[1]) / max(now - self._mark[0], 1e-9)
        self._mark = (now, samples)
        fields = {**s.train_metrics, "lr": s.lr, "samples/s": rate}
        times = run.last_times
        if self.bar is not None:
            self.bar.set_postfix_str(format_metrics(fields))  # drawn now: a fast epoch still shows them
        else:
            shares = f" | {times.compact()}" if times is not None and times.steps else ""
            run.log(f"epoch {s.epoch + 1} step {s.step_in_epoch}/{run.steps_per_epoch} "
                    f"{format_metrics(fields)}{shares}")

    def on_epoch_end(self, run: Run) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        record, s = dict(run.state.history[-1]), run.state
        ended = "done"
        if s.samples_in_epoch:  # the loop moves on to the next epoch only after a whole one
            why = f"max_steps {run.config.max_steps}" if _max_steps_reached(run) else "stopped"
            ended = f"cut short at step {s.step_in_epoch} of {run.steps_per_epoch} ({why})"
        run.log(f"epoch {record.pop('epoch') + 1} {ended}: {format_metrics(record)}")

    def on_train_end(self, run: Run) -> None:
        if run.state.stop_reason:
            run.log(f"stopped: {run.state.stop_reason}")
