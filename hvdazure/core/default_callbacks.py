"""The callbacks every run has, chosen from its config: the LR schedule, early stopping, progress, the
experiment loggers, periodic checkpoints and the preemption watcher. Beside core/callbacks.py, not in it:
the loggers, the checkpoint callback and the watcher are callbacks themselves (they import callbacks.py).
"""

from __future__ import annotations

from pathlib import Path

from hvdazure.core.callbacks import Callback, EarlyStopping, LRScheduleCallback, ProgressLogger
from hvdazure.core.checkpoint.trainer_checkpoints import CheckpointCallback, TrainerCheckpoints
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.environments import Environment
from hvdazure.core.loggers import MLflowLogger, TensorBoardLogger, default_mlflow_uri
from hvdazure.core.preemption_watcher import PreemptionWatcher
from hvdazure.core.run_context import RunContext


def default_callbacks(config: TrainConfig, environment: Environment, checkpoints: TrainerCheckpoints | None,
                      context: RunContext | None) -> list[Callback]:
    """The run's own callbacks, in the order they get each event (before the user's): `checkpoints` is
    None without checkpointing; `context` the program's running this script (a sweep), if any, which names
    the MLflow run. A ConfigError for a preemption watch without checkpoints."""
    c = config
    callbacks: list[Callback] = [LRScheduleCallback()]
    if c.early_stopping_patience is not None:
        callbacks.append(EarlyStopping(c.monitor, c.monitor_mode, c.early_stopping_patience,
                                       c.early_stopping_min_delta))
    callbacks.append(ProgressLogger(use_bar=None if c.progress_bar else False))
    if c.tensorboard:
        callbacks.append(TensorBoardLogger(Path(c.output_dir) / "tensorboard"))
    if c.mlflow:
        callbacks.append(MLflowLogger(
            c.mlflow_tracking_uri or default_mlflow_uri(c.output_dir),
            parent_run_id=context.mlflow_parent_run_id if context else None,
            run_name=context.run_name if context else None))
    if checkpoints is not None:
        callbacks.append(CheckpointCallback(checkpoints, c.checkpoint_every_steps, c.checkpoint_every_epochs))
    # The environment says whether and how a preemption is announced ahead (core/environments/)
    notices = environment.preemption_notices(c.preemption_watch, c.scheduled_events_url)
    if notices is not None:
        if checkpoints is None:
            raise ConfigError("config field 'preemption_watch': true needs checkpoint_dir (a preemption "
                              "notice is answered with a checkpoint)")
        callbacks.append(PreemptionWatcher(notices))
    return callbacks
