"""The framework-agnostic training loop. Bindings (hvdazure.torch, hvdazure.tensorflow) subclass Trainer and
supply the framework operations; users subclass a binding and supply the model, data and steps.

The loop emits named events (core/callbacks.py); logging, LR warmup and early stopping are callbacks.
Every collective in the loop is entered by all ranks at the same point: step counts per epoch are equal
on every rank by construction (core/sharding.py) and every decision comes from reduced values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hvdazure.core.callbacks import Callback, EarlyStopping, LRScheduleCallback, ProgressLogger
from hvdazure.core.config import TrainConfig
from hvdazure.core.loggers import MLflowLogger, TensorBoardLogger, default_mlflow_uri
from hvdazure.core.lr import LRSchedule
from hvdazure.core.metrics import MetricAccumulator, RunningMean
from hvdazure.core.rank_logging import configure_logging, logger
from hvdazure.core.sharding import MicroBatch, ShardPlan
from hvdazure.core.state import TrainState


class Trainer(ABC):
    """Runs `fit()`: epochs of sharded optimizer steps, periodic metric reduction, evaluation, events."""

    def __init__(self, config: TrainConfig | None = None, callbacks: Sequence[Callback] = ()) -> None:
        self.config = config if config is not None else TrainConfig()
        self.user_callbacks = list(callbacks)
        self.state = TrainState()
        self.rank, self.world_size, self.local_rank = 0, 1, 0
        self.plan: ShardPlan
        self.schedule: LRSchedule
        self.callbacks: list[Callback] = []

    # --- what a binding provides -----------------------------------------------------------------------
    @abstractmethod
    def _init_distributed(self) -> tuple[int, int, int]:
        """Start Horovod; return (rank, world size, local rank)."""

    @abstractmethod
    def _load_datasets(self) -> int:
        """Build the datasets; return the number of training samples."""

    @abstractmethod
    def _build(self, peak_lr: float) -> None:
        """Build model and optimizer (with the scaled LR) and make every rank start from rank 0's state."""

    @abstractmethod
    def _run_step(self, micro_batches: list[MicroBatch], meter: MetricAccumulator) -> None:
        """Forward/backward over this rank's micro-batches, one optimizer step; add metrics to `meter`."""

    @abstractmethod
    def _evaluate(self, meter: MetricAccumulator) -> bool:
        """Add this rank's evaluation metrics to `meter`; False if there is no evaluation dataset."""

    @abstractmethod
    def _allreduce_sum(self, values: Sequence[Any]) -> list[float]:
        """Elementwise sum across ranks, in one collective."""

    @abstractmethod
    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate."""

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

    def log(self, message: str) -> None:
        """Log on rank 0 only."""
        logger.info(message)

    # --- the loop ------------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train; return the per-epoch history of train and eval metrics, identical on every rank."""
        self._prepare()
        self._emit("on_train_start")
        while not self._finished():
            self._train_epoch()
        self._emit("on_train_end")
        return self.state.history

    def _train_epoch(self) -> None:
        s = self.state
        self._emit("on_epoch_start")
        for micro_batches in self.plan.epoch(s.epoch, start_step=s.step_in_epoch):
            self._emit("on_step_begin")
            self._run_step(micro_batches, self._meter)
            s.step += 1
            s.step_in_epoch += 1
            s.samples_seen += micro_batches[0].step_samples
            s.synced = s.step % self.config.log_every == 0
            if s.synced:
                self._sync()
            self._emit("on_step_end")
            if s.should_stop or s.step >= self.schedule.total_steps:
                break
        self._sync()  # the epoch's last, partial log interval
        epoch_done = s.step_in_epoch == self.steps_per_epoch
        train = {f"train_{k}": v for k, v in self._epoch_train.means().items()}
        record = {"epoch": s.epoch, "step": s.step, "samples_seen": s.samples_seen, "lr": s.lr, **train}
        if self._eval_due(epoch_done) and self._run_evaluation():
            record.update({f"eval_{k}": v for k, v in s.eval_metrics.items()})
            self._emit("on_eval_end")
        s.history.append(record)
        self._emit("on_epoch_end")
        self._sync()  # agree on stops requested during evaluation or by epoch-end callbacks
        if epoch_done:
            s.epoch, s.step_in_epoch, self._epoch_train = s.epoch + 1, 0, RunningMean()

    # --- pieces of the loop --------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self.rank, self.world_size, self.local_rank = self._init_distributed()
        configure_logging(self.rank)
        c = self.config
        self.plan = ShardPlan(self._load_datasets(), c.batch_size, self.world_size, self.rank,
                              c.grad_accum_steps, c.seed)
        self.schedule = LRSchedule.from_config(c, self.world_size, self.plan.steps_per_epoch)
        self._build(self.schedule.peak_lr)
        self.state.lr = self.schedule.lr_at(self.state.step)
        self.callbacks = [cb for cb in self._default_callbacks() + self.user_callbacks
                          if self.is_main or not cb.main_only]
        self._meter, self._epoch_train = MetricAccumulator(), RunningMean()

    def _default_callbacks(self) -> list[Callback]:
        c = self.config
        callbacks: list[Callback] = [LRScheduleCallback(self.schedule)]
        if c.early_stopping_patience is not None:
            callbacks.append(EarlyStopping(c.monitor, c.monitor_mode, c.early_stopping_patience,
                                           c.early_stopping_min_delta))
        callbacks.append(ProgressLogger(use_bar=None if c.progress_bar else False))
        if c.tensorboard:
            callbacks.append(TensorBoardLogger(Path(c.output_dir) / "tensorboard"))
        if c.mlflow:
            callbacks.append(MLflowLogger(c.mlflow_tracking_uri or default_mlflow_uri(c.output_dir)))
        return callbacks

    def _emit(self, event: str) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self)

    def _sync(self) -> None:
        """One fused allreduce: the interval's metric sums, its sample count, and the ranks' stop votes."""
        s = self.state
        means, count, (votes,) = self._meter.reduce(self._allreduce_sum, flags=[float(s.stop_requested)])
        if count:
            s.train_metrics = means
            self._epoch_train.add(means, count)
        if votes:
            s.should_stop = True
            s.stop_reason = s.stop_reason or "stop requested by another rank"

    def _run_evaluation(self) -> bool:
        meter = MetricAccumulator()
        if not self._evaluate(meter):
            return False
        self.state.eval_metrics, _, _ = meter.reduce(self._allreduce_sum)
        return True

    def _eval_due(self, epoch_done: bool) -> bool:
        s = self.state
        last = s.should_stop or s.step >= self.schedule.total_steps or (
            epoch_done and s.epoch + 1 >= self.config.epochs)
        return last or (epoch_done and (s.epoch + 1) % self.config.eval_every == 0)

    def _finished(self) -> bool:
        s = self.state
        return s.should_stop or s.step >= self.schedule.total_steps or s.epoch >= self.config.epochs
