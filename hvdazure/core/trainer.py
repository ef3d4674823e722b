"""The framework-agnostic training loop. Bindings (hvdazure.torch, hvdazure.tensorflow) subclass Trainer and
supply the framework operations; users subclass a binding and supply the model, data and steps.

The loop emits named events (core/callbacks.py); logging, LR warmup, early stopping and periodic
checkpoints are callbacks. Every collective in the loop is entered by all ranks at the same point: step
counts per epoch are equal on every rank by construction (core/sharding.py) and every decision comes from
reduced values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hvdazure.core import run_context
from hvdazure.core.binding import Collectives, FrameworkState
from hvdazure.core.callbacks import Callback, EarlyStopping, LRScheduleCallback, ProgressLogger
from hvdazure.core.checkpoint import CheckpointError
from hvdazure.core.checkpointing import CheckpointCallback, TrainerCheckpoints, default_checkpoint_dir
from hvdazure.core.cluster import detect_environment
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.loggers import MLflowLogger, TensorBoardLogger, default_mlflow_uri
from hvdazure.core.lr import LRSchedule
from hvdazure.core.metrics import MetricAccumulator, RunningMean
from hvdazure.core.rank_logging import configure_logging, logger
from hvdazure.core.sharding import MicroBatch, ShardPlan
from hvdazure.core.state import TrainState
from hvdazure.core.stop_signals import stop_signals_caught


class Trainer(ABC):
    """Runs `fit()`: epochs of sharded optimizer steps, periodic metric reduction, evaluation, events."""

    framework_name = "none"

    def __init__(self, config: TrainConfig | None = None, callbacks: Sequence[Callback] = (),
                 comm: Any = None) -> None:
        """`comm`: an mpi4py communicator to start Horovod on, for a program that runs several trainings in
        one MPI job (under the MPI controller only); default: every rank of the job. Inside
        `hvdazure sweep`, the trial's group of ranks, its parameters and callbacks (core/run_context.py)."""
        context = run_context.current()
        config = config if config is not None else TrainConfig()
        self.config = context.apply(config) if context is not None else config
        self.user_callbacks = list(callbacks) + (list(context.callbacks) if context is not None else [])
        self.mpi_comm = comm if comm is not None else (context.communicator if context is not None else None)
        self._context = context
        self.state = TrainState()
        self.rank, self.world_size, self.local_rank = 0, 1, 0
        self.comm: Collectives  # set by fit(): the binding's collectives over all ranks
        self.state_io: FrameworkState  # set by the binding's _build: model/optimizer/RNG persistence
        self.plan: ShardPlan
        self.schedule: LRSchedule
        self.callbacks: list[Callback] = []
        self._checkpoints: TrainerCheckpoints | None = None
        self._signal: int | None = None  # a stop signal this rank received
        self._signal_reason: str | None = None  # what asked for it, when not a real signal

    # --- what a binding provides -----------------------------------------------------------------------
    @abstractmethod
    def _init_distributed(self) -> Collectives:
        """Start Horovod on `self.mpi_comm`'s ranks (None: all; pin devices, share the cores); return the
        collectives over its ranks."""

    @abstractmethod
    def _shutdown_distributed(self) -> None:
        """Shut Horovod down (a program running several trainings starts it afresh for each)."""

    @abstractmethod
    def _load_datasets(self) -> int:
        """Build the datasets; return the number of training samples."""

    @abstractmethod
    def _build(self, peak_lr: float) -> None:
        """Build model and optimizer (with the scaled LR) and `self.state_io`, the FrameworkState that
        saves and loads them; seed this rank's RNGs."""

    @abstractmethod
    def _broadcast_model_and_optimizer(self) -> None:
        """Make every rank's model and optimizer equal to rank 0's."""

    @abstractmethod
    def _run_step(self, micro_batches: list[MicroBatch], meter: MetricAccumulator,
                  stop_vote: float | None) -> float:
        """Forward/backward over this rank's micro-batches, one optimizer step; add metrics to `meter`.

        `stop_vote` (1.0: this rank got a stop signal; None: no vote this run) is summed over ranks in the
        same step, without a blocking collective of its own (asynchronously, or inside the compiled step);
        return the sum (0.0 without a vote)."""

    @abstractmethod
    def _evaluate(self, meter: MetricAccumulator) -> bool:
        """Add this rank's evaluation metrics to `meter`; False if there is no evaluation dataset."""

    @abstractmethod
    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate."""

    def seed_everything(self, seed: int) -> None:
        """Seed Python, NumPy and the framework on this rank."""
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.state_io.seed(seed)

    def broadcast_model_and_optimizer(self) -> None:
        """Make every rank's model and optimizer equal to rank 0's (after a resume, for instance)."""
        self._broadcast_model_and_optimizer()

    def framework_versions(self) -> dict[str, str]:
        return {}

    def _metric_to_float64(self, value: Any) -> Any:
        """A metric value as float64, on its device (no synchronisation); see MetricAccumulator."""
        return float(value)

    def _min_samples_per_micro_batch(self) -> tuple[int, str]:
        """The fewest samples a training micro-batch may hold, and why (e.g. BatchNorm layers need 2)."""
        return 1, ""

    # --- derived facts -----------------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def global_batch_size(self) -> int:
        return self.config.global_batch_size(self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return self.plan.steps_per_epoch

    @property
    def schedule_step(self) -> int:
        """The optimizer step the LR schedule is at: by epochs and steps of the current world size."""
        return self.state.epoch * self.steps_per_epoch + self.state.step_in_epoch

    def log(self, message: str) -> None:
        """Log on rank 0 only."""
        logger.info(message)

    def stateful_callbacks(self) -> dict[str, Callback]:
        """Callbacks whose state a checkpoint keeps, by a key stable across runs (class name and index)."""
        keyed: dict[str, Callback] = {}
        for callback in self.callbacks:
            if not callback.main_only:
                name = type(callback).__name__
                keyed[f"{name}#{sum(k.startswith(name + '#') for k in keyed)}"] = callback
        return keyed

    def save_checkpoint(self, reason: str = "manual", wait: bool = True) -> str | None:
        """Checkpoint now; every rank must call this at the same step. With wait=False rank 0 writes in the
        background and training goes on; the name is returned once written (wait=True)."""
        if self._checkpoints is None:
            raise CheckpointError("checkpointing is off: set checkpoint_dir")
        self._sync()  # the interval's metrics go into the epoch's means, which the checkpoint keeps
        return self._checkpoints.save(reason, wait=wait)

    # --- the loop ------------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train; return the per-epoch history of train and eval metrics, identical on every rank."""
        _show_user_errors_in_one_line()
        self._prepare()
        with self._stop_signals_caught():
            try:
                self._emit("on_train_start")
                while not self._finished():
                    self._train_epoch()
            except (ConfigError, CheckpointError, SystemExit, KeyboardInterrupt):
                raise
            except Exception as exc:
                if self._checkpoints is not None:  # peers may be gone: rank 0 saves alone, if it can
                    self._checkpoints.save_emergency(f"error: {type(exc).__name__}")
                raise
            if self._checkpoints is not None:
                if self._checkpoints.last_saved_step != self.state.step:
                    self.save_checkpoint("final")
                self._checkpoints.finish_pending()  # a background write of this very step
            self._emit("on_train_end")
        return self.state.history

    def _train_epoch(self) -> None:
        s = self.state
        self._emit("on_epoch_start")
        for micro_batches in self.plan.epoch(s.epoch, start_sample=s.samples_in_epoch):
            self._emit("on_step_begin")
            signal_votes = self._run_step(micro_batches, self._meter, self._stop_vote())
            s.step += 1
            s.step_in_epoch += 1
            s.samples_in_epoch += micro_batches[0].step_samples
            s.samples_seen += micro_batches[0].step_samples
            s.synced = s.step % self.config.log_every == 0
            if s.synced:
                self._sync()
            self._emit("on_step_end")
            if signal_votes > 0:
                self._stop_for_signal()
            if s.should_stop or self._max_steps_reached():
                break
        self._sync()  # the epoch's last, partial log interval
        epoch_done = s.samples_in_epoch == self.plan.num_samples
        train = {f"train_{k}": v for k, v in self.epoch_train.means().items()}
        record = {"epoch": s.epoch, "step": s.step, "samples_seen": s.samples_seen, "lr": s.lr, **train}
        if self._eval_due(epoch_done) and self._run_evaluation():
            record.update({f"eval_{k}": v for k, v in s.eval_metrics.items()})
            self._emit("on_eval_end")
        s.history.append(record)
        if epoch_done:
            s.epoch, s.step_in_epoch, s.samples_in_epoch = s.epoch + 1, 0, 0
            self.epoch_train = RunningMean()
        self._emit("on_epoch_end")
        self._sync()  # agree on stops requested during evaluation or by epoch-end callbacks

    # --- pieces of the loop --------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self.comm = self._init_distributed()
        if self._context is not None:
            self._context.shutdowns.append(self._shutdown_distributed)
        run_context.check_world(self.mpi_comm, self.comm.size)
        self.rank, self.world_size, self.local_rank = self.comm.rank, self.comm.size, self.comm.local_rank
        configure_logging(self.rank)
        c = self.config
        self.plan = ShardPlan(self._load_datasets(), c.batch_size, self.world_size, self.rank,
                              c.grad_accum_steps, c.seed)
        self.schedule = LRSchedule.from_config(c, self.world_size, self.plan.steps_per_epoch)
        checkpoint_dir = default_checkpoint_dir(c.checkpoint_dir)
        if c.resume == "auto" and checkpoint_dir is None:
            raise ConfigError("config field 'resume': 'auto' needs checkpoint_dir")
        self._build(self.schedule.peak_lr)
        self._broadcast_model_and_optimizer()
        self._meter, self.epoch_train = self._new_meter(), RunningMean()
        if checkpoint_dir is not None:
            self._checkpoints = TrainerCheckpoints(self, checkpoint_dir)
        self.callbacks = [cb for cb in self._default_callbacks() + self.user_callbacks
                          if self.is_main or not cb.main_only]
        if c.resume is not None:
            # the directory above the checkpoint, as a URL too (pathlib would make abfs://c/run abfs:/c)
            parent = c.resume.rstrip("/").rpartition("/")[0] or "."
            source = self._checkpoints or TrainerCheckpoints(self, parent)
            source.resume(c.resume)
        if c.max_steps is not None:  # a resume at another world size: max_steps counts the steps taken
            end = self.schedule_step + max(0, c.max_steps - self.state.step)
            total = min(self.schedule.total_steps, end)
            self.schedule = dataclasses.replace(self.schedule, total_steps=total)
        self._check_micro_batch_sizes()
        self.state.lr = self.schedule.lr_at(self.schedule_step)

    def _check_micro_batch_sizes(self) -> None:
        """A ConfigError on every rank, before training, if the plan gives some rank a micro-batch smaller
        than the model can train on (the short last step of an epoch, e.g. 1 sample for BatchNorm)."""
        need, why = self._min_samples_per_micro_batch()
        smallest = min(self.plan.smallest_micro_batch(0), self.plan.smallest_micro_batch(
            self.state.samples_in_epoch))
        if smallest >= need:
            return
        c, plan = self.config, self.plan
        fits = plan.nearest_batch_sizes(min_micro_batch=need)
        raise ConfigError(
            f"config field 'batch_size': {c.batch_size} leaves a micro-batch of {smallest} sample(s) in the "
            f"last step of an epoch ({plan.num_samples} samples, global batch {plan.global_batch_size} = "
            f"{c.batch_size} x {self.world_size} rank(s) x {c.grad_accum_steps} micro-batch(es)), and {why}; "
            f"try batch_size {' or '.join(map(str, fits))}")

    def _default_callbacks(self) -> list[Callback]:
        c = self.config
        callbacks: list[Callback] = [LRScheduleCallback()]
        if c.early_stopping_patience is not None:
            callbacks.append(EarlyStopping(c.monitor, c.monitor_mode, c.early_stopping_patience,
                                           c.early_stopping_min_delta))
        callbacks.append(ProgressLogger(use_bar=None if c.progress_bar else False))
        if c.tensorboard:
            callbacks.append(TensorBoardLogger(Path(c.output_dir) / "tensorboard"))
        if c.mlflow:
            context = self._context
            callbacks.append(MLflowLogger(
                c.mlflow_tracking_uri or default_mlflow_uri(c.output_dir),
                parent_run_id=context.mlflow_parent_run_id if context else None,
                run_name=context.run_name if context else None))
        if self._checkpoints is not None:
            callbacks.append(CheckpointCallback(self._checkpoints, c.checkpoint_every_steps,
                                                c.checkpoint_every_epochs))
        # The environment knows whether and how a preemption is announced ahead (core/cluster/)
        watcher = detect_environment().preemption_watcher(c.preemption_watch, c.scheduled_events_url)
        if watcher is not None:
            if self._checkpoints is None:
                raise ConfigError("config field 'preemption_watch': true needs checkpoint_dir (a preemption "
                                  "notice is answered with a checkpoint)")
            callbacks.append(watcher)
        return callbacks

    def _emit(self, event: str) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self)

    def _gather_names(self, names: list[str]) -> list[list[str]]:
        return [json.loads(b) for b in self.comm.allgather_bytes(json.dumps(names).encode())]

    def _new_meter(self) -> MetricAccumulator:
        return MetricAccumulator(self._metric_to_float64)

    def _sync(self) -> None:
        """One fused collective: the interval's metric sums and counts, and the ranks' stop votes."""
        s = self.state
        reduced = self._meter.reduce(self.comm.allgather_floats, self._gather_names,
                                     flags=[float(s.stop_requested)])
        if reduced.count:
            s.train_metrics = reduced.means
            self.epoch_train.add(reduced)
        if reduced.flags[0]:
            s.should_stop = True
            s.stop_reason = s.stop_reason or "stop requested by another rank"

    def _run_evaluation(self) -> bool:
        meter = self._new_meter()
        if not self._evaluate(meter):
            return False
        self.state.eval_metrics = meter.reduce(self.comm.allgather_floats, self._gather_names).means
        return True

    def _eval_due(self, epoch_done: bool) -> bool:
        s = self.state
        last = s.should_stop or self._max_steps_reached() or (
            epoch_done and s.epoch + 1 >= self.config.epochs)
        return last or (epoch_done and (s.epoch + 1) % self.config.eval_every == 0)

    def _max_steps_reached(self) -> bool:
        return self.config.max_steps is not None and self.state.step >= self.config.max_steps

    @property
    def finished(self) -> bool:
        """Whether training has reached its end (at an epoch's end: whether that was the last epoch)."""
        return self._finished()

    def _finished(self) -> bool:
        """Training ends by epochs completed (counted in samples, so it holds across a resume at another
        world size, where step numbers change meaning), by max_steps optimizer steps taken, or by a stop."""
        s = self.state
        return s.should_stop or self._max_steps_reached() or s.epoch >= self.config.epochs

    # --- stop signals (SIGTERM on preemption, SIGINT) ------------------------------------------------------
    def _stop_signals_caught(self) -> contextlib.AbstractContextManager:
        """While checkpointing, a first SIGTERM/SIGINT only sets a flag: all ranks agree on it at the next
        step, save a final checkpoint together, and exit with 128 + the signal number. A second one exits
        at once (core/stop_signals.py)."""
        if self._checkpoints is None:
            return contextlib.nullcontext()

        def note(signum: int) -> None:
            self._signal = self._signal or signum

        return stop_signals_caught(note)

    def _stop_vote(self) -> float | None:
        """This rank's vote to stop for a signal, summed over ranks during the step; None when signals are
        not caught (no checkpointing: they end the process as usual)."""
        return None if self._checkpoints is None else float(self._signal is not None)

    def request_checkpoint_and_exit(self, reason: str, signum: int = signal.SIGTERM) -> None:
        """Make every rank save a checkpoint at the next step and exit with 128 + `signum`, as a first
        SIGTERM does (it travels in the same per-step vote: no collective of its own). Safe to call from
        any thread of any rank, e.g. a watcher of the cloud's preemption notices. Needs checkpointing."""
        if self._signal is None:
            self._signal_reason = reason
            self._signal = signum

    def _stop_for_signal(self) -> None:
        name = signal.Signals(self._signal).name if self._signal else "a stop signal on another rank"
        what = self._signal_reason or name
        saved = self.save_checkpoint(f"signal: {what}")
        logger.warning(f"received {what}: saved checkpoint {saved}; exiting")
        raise SystemExit(128 + (self._signal or signal.SIGTERM))


_USER_ERRORS = (ConfigError, CheckpointError)


def _show_user_errors_in_one_line() -> None:
    """A ConfigError or CheckpointError that ends the script prints as one line (`hvdazure: error: ...`),
    not a traceback: its message already names the bad value. Code that catches them is unaffected."""
    previous = sys.excepthook
    if getattr(previous, "hvdazure", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback: Any) -> None:
        if issubclass(kind, _USER_ERRORS):
            sys.stderr.write(f"hvdazure: error: {error}\n")
        else:
            previous(kind, error, traceback)

    hook.hvdazure = True  # type: ignore[attr-defined]
    sys.excepthook = hook
