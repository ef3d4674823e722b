"""Keras 3 callbacks for a data-parallel `model.fit`: what horovod.tensorflow.keras's callbacks did, on
horovod.tensorflow and the core's LR schedule and checkpoint manager.

Every rank runs the same callbacks at the same points (fit gives all ranks the same steps), so their
collectives meet. Put `MetricAverage` before callbacks that read the epoch's logs (Checkpoint, EarlyStopping).
"""

from __future__ import annotations

import math
from typing import Any

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdazure.core.agreement import Failure, rank0_decides
from hvdazure.core.checkpoint.store import CheckpointError, CheckpointManager, new_run_id
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.lr import LRSchedule
from hvdazure.tensorflow.checkpoint_content import KerasCheckpointContent, broadcast_variables, model_weights
from hvdazure.tensorflow.collectives import TensorFlowCollectives
from hvdazure.tensorflow.gradients import refuse_zero_stage
from hvdazure.tensorflow.keras.training import DataParallelStep


class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of training, every rank takes `root_rank`'s model weights and optimizer variables
    (the optimizer's are built first: Keras makes them lazily), in one broadcast per dtype."""

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if not isinstance(model.train_step, DataParallelStep):  # the ranks would drift apart silently
            raise RuntimeError("call hvdazure.tensorflow.keras.data_parallel(model) before fit: without it "
                               "no gradient is averaged across ranks")
        if not model.built:
            raise RuntimeError("build the model before fit (start it with keras.Input, or call model.build): "
                               "weights created during fit would differ between ranks")
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        broadcast_variables([*model_weights(model), *model.optimizer.variables], self.root_rank)


class MetricAverage(keras.callbacks.Callback):
    """The epoch's metrics over all ranks, exactly: the state variables of every Keras metric (a Mean's
    total and count, a Precision's true and false positives, ...) are summed over ranks in one float64
    allreduce and the metrics computed from the sums, so each is the mean over all samples, not a mean of
    the ranks' means, and the epoch's logs (train and val_) are identical on every rank. Train metrics are
    summed before fit's validation pass resets them; per-batch logs stay local. Metrics whose state is not
    a sum over samples (none of Keras's built-in ones) would be wrong. After a plain `model.evaluate`,
    call `sum_metric_states(model)` for the whole set's metrics."""

    def __init__(self) -> None:
        super().__init__()
        self._fitting = False
        self._train_logs: dict[str, float] | None = None
        self._val_logs: dict[str, float] = {}

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._fitting = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._fitting = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._train_logs, self._val_logs = None, {}

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._fitting:  # fit's validation pass is about to reset the train metrics
            self._train_logs = sum_metric_states(self.model)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._fitting:  # Keras hands callbacks a copy of these logs: fit's own val_ logs are set below
            self._val_logs = {f"val_{name}": value for name, value in sum_metric_states(self.model).items()}

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        train_logs = self._train_logs if self._train_logs is not None else sum_metric_states(self.model)
        if logs is not None:  # the dict that later callbacks and fit's History read
            logs.update(train_logs)
            logs.update(self._val_logs)


def sum_metric_states(model: keras.Model) -> dict[str, float]:
    """Set every metric's state variables to their sums over all ranks (one allreduce) and return the
    metrics' results, identical on every rank."""
    variables = [v for metric in model.metrics for v in metric.variables]
    if variables:
        flat = tf.concat([tf.reshape(tf.cast(v.value, tf.float64), [-1]) for v in variables], axis=0)
        summed = hvd.allreduce(flat, op=hvd.Sum, name="hvdazure.keras.metric_states")
        sizes = [math.prod(v.shape) for v in variables]
        for variable, piece in zip(variables, tf.split(summed, sizes), strict=True):
            variable.assign(tf.cast(tf.reshape(piece, variable.shape), variable.dtype))
    return {name: float(value) for name, value in model.get_metrics_result().items()}


class LearningRateSchedule(keras.callbacks.Callback):
    """Sets the optimizer's LR before every step from the core's schedule for `config`: `lr` scaled for
    the global batch (`lr_scaling`, `base_batch_size`), warmup (`warmup_epochs` or `warmup_steps`), then
    `schedule` (constant, cosine to `min_lr`, or step), counted in optimizer steps. `steps_per_epoch` is
    fit's (shard_for_fit's). Give the optimizer a number as learning_rate, not a schedule. `config`'s
    `grad_accum_steps` must be 1 and its `zero_stage` 0 (sharded optimizer state is PyTorch-only)."""

    def __init__(self, config: TrainConfig, steps_per_epoch: int) -> None:
        super().__init__()
        if config.grad_accum_steps != 1:
            raise ConfigError(f"config field 'grad_accum_steps': {config.grad_accum_steps!r} is not "
                              "supported with model.fit (one batch per optimizer step)")
        refuse_zero_stage(config.zero_stage, "model.fit")
        self.schedule = LRSchedule.from_config(config, hvd.size(), steps_per_epoch)
        self._epoch = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        steps = self.params.get("steps")
        if steps != self.schedule.steps_per_epoch:
            raise ValueError(f"LearningRateSchedule was made for {self.schedule.steps_per_epoch} steps per "
                             f"epoch, fit runs {steps}: pass fit the same steps_per_epoch")
        if self.model.steps_per_execution != 1:
            raise ValueError("LearningRateSchedule sets the LR of every step: compile with "
                             "steps_per_execution=1")

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self._epoch * self.schedule.steps_per_epoch + batch
        self.model.optimizer.learning_rate = self.schedule.lr_at(step)


class Checkpoint(keras.callbacks.Callback):
    """Every `every_epochs` epochs, rank 0 saves the model's weights and the optimizer's variables (as
    `.npz`, loadable without running code: hvdazure.tensorflow.load_weights) through the core's
    CheckpointManager into `directory` (a path or fsspec URL): atomic, verified, `latest`, the newest
    `keep_last` kept plus the best `keep_best` by `monitor`. Other ranks write nothing; a failed save is
    an error on every rank. Put it after MetricAverage, so that the manifest's metrics are global. Each
    Checkpoint is one run (its id in every manifest): retention, `latest` and `best` never take in another
    run's checkpoints in the same directory, and `latest` names this run's newest."""

    def __init__(self, directory: str, every_epochs: int = 1, keep_last: int = 3, keep_best: int = 0,
                 monitor: str = "val_loss", mode: str = "min") -> None:
        super().__init__()
        self.directory, self.every_epochs, self.monitor, self.mode = directory, every_epochs, monitor, mode
        self._manager = CheckpointManager(directory, keep_last, keep_best, monitor if keep_best else None,
                                          mode, run_id=new_run_id()) if hvd.rank() == 0 else None
        self._collectives = TensorFlowCollectives()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if (epoch + 1) % self.every_epochs:
            return
        # rank 0 saves; its failure is one CheckpointError on every rank (one broadcast), never a hang
        rank0_decides(self._collectives, lambda: self._save(epoch + 1, logs or {}), Failure(
            Exception, CheckpointError,
            lambda exc: f"checkpoint save in {self.directory} failed: {type(exc).__name__}: {exc}"))

    def _save(self, epochs_done: int, logs: dict[str, Any]) -> None:
        optimizer = self.model.optimizer
        metrics = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
        manifest = {"framework": "tensorflow", "source": "keras_fit", "epoch": epochs_done,
                    "world_size": hvd.size(), "metrics": metrics,
                    "config": {"monitor": self.monitor, "monitor_mode": self.mode}}
        # written before training goes on: no copy
        files = KerasCheckpointContent(self.model, optimizer).save_files(copy=False)
        assert self._manager is not None  # rank 0's
        self._manager.save(int(optimizer.iterations), files, manifest)
