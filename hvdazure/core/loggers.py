"""Experiment loggers as rank-0 callbacks: TensorBoard event files and MLflow runs.

Both log the reduced (all-rank) metrics, so what they record does not depend on which rank writes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdazure.core.callbacks import BuiltinCallback
from hvdazure.core.rank_logging import logger
from hvdazure.core.run_protocol import Run

if TYPE_CHECKING:
    from hvdazure.core.tensorboard_events import EventFile


class TensorBoardLogger(BuiltinCallback):
    """Scalars under `<output_dir>/tensorboard`: train metrics per log interval, eval per evaluation."""

    main_only = True
    writer: EventFile  # from on_train_start on

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)

    def on_train_start(self, run: Run) -> None:
        from hvdazure.core.tensorboard_events import EventFile  # tensorboard's protobufs: only when used

        self.writer = EventFile(self.log_dir)

    def on_step_end(self, run: Run) -> None:
        s = run.state
        if s.metrics_reduced:
            for name, value in {**s.train_metrics, "lr": s.lr}.items():
                self.writer.add_scalar(f"train/{name}", value, step=s.step)
            for name, value in _time_scalars(run).items():
                group, _, rest = name.partition("_")  # gpu_memory_peak_gib_max: gpu/memory_peak_gib_max
                tag = f"gpu/{rest}" if group == "gpu" else f"time/{name.removeprefix('time_')}"
                self.writer.add_scalar(tag, value, step=s.step)
            self.writer.flush()

    def on_eval_end(self, run: Run) -> None:
        for name, value in run.state.eval_metrics.items():
            self.writer.add_scalar(f"eval/{name}", value, step=run.state.step)
        self.writer.flush()

    def on_train_end(self, run: Run) -> None:
        self.writer.close()


def default_mlflow_uri(output_dir: str | Path) -> str:
    """Azure ML's tracking URI inside Azure ML (it sets MLFLOW_TRACKING_URI), else a local SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}"


class MLflowLogger(BuiltinCallback):
    """One MLflow run per training: the config as params, metrics by optimizer step. With `parent_run_id`
    (a sweep's trials), a child run named `run_name` of that run: the same one again when the training is
    resumed. A later fit() of the same trainer logs into the run of its first."""

    main_only = True

    def __init__(self, tracking_uri: str, experiment: str = "hvdazure", parent_run_id: str | None = None,
                 run_name: str | None = None) -> None:
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.parent_run_id, self.run_name = parent_run_id, run_name
        self.mlflow_run: Any = None

    def on_train_start(self, run: Run) -> None:
        import mlflow

        if self.tracking_uri.startswith("sqlite:///"):
            Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        # inside Azure ML: the job's run (the same on every rank) in the workspace's store. Read before
        # set_tracking_uri, which rewrites MLFLOW_TRACKING_URI.
        job_run, job_store = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(self.tracking_uri)
        if self.mlflow_run is not None:  # a later fit() of the same trainer: its run goes on
            self.mlflow_run = mlflow.start_run(run_id=self.mlflow_run.info.run_id)
        elif self.parent_run_id:
            self.mlflow_run = mlflow.start_run(run_id=self._child_run_id(mlflow.MlflowClient()))
        elif job_run and self.tracking_uri == job_store:
            self.mlflow_run = mlflow.start_run(run_id=job_run)
        else:
            experiment = mlflow.set_experiment(self.experiment)
            # a tracking URI of the user's own: start_run() alone would look for the job's run in it
            own = mlflow.MlflowClient().create_run(experiment.experiment_id).info.run_id if job_run else None
            self.mlflow_run = mlflow.start_run(run_id=own)
        params = {k: v for k, v in run.config.to_dict().items() if k != "extra"}
        params.update({f"extra.{k}": v for k, v in run.config.extra.items()})
        params.update(world_size=run.world_size, global_batch_size=run.global_batch_size,
                      scaled_lr=run.schedule.peak_lr)
        # A job Azure ML runs again (after a preemption) logs into the same run, whose params cannot change
        logged = self.mlflow_run.data.params
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != str(v))
        if changed:
            logger.warning(f"MLflow run {self.mlflow_run.info.run_id} keeps the values of its first attempt "
                           f"for {', '.join(changed)} (MLflow params cannot change)")
        mlflow.log_params({k: str(v) for k, v in params.items() if k not in logged})

    def _child_run_id(self, client: Any) -> str:
        """The child run of this name under the parent: found (a resumed trial) or created."""
        parent = client.get_run(self.parent_run_id)
        experiment = parent.info.experiment_id
        name = self.run_name or "run"
        found = client.search_runs([experiment], filter_string=(
            f"tags.`mlflow.parentRunId` = '{self.parent_run_id}' and tags.`hvdazure.run_name` = '{name}'"))
        if found:
            return str(found[0].info.run_id)
        return str(client.create_run(experiment, run_name=name, tags={
            "mlflow.parentRunId": self.parent_run_id, "hvdazure.run_name": name}).info.run_id)

    def on_step_end(self, run: Run) -> None:
        import mlflow

        s = run.state
        if s.metrics_reduced:
            metrics = {f"train_{k}": v for k, v in s.train_metrics.items()}
            mlflow.log_metrics({**metrics, "lr": s.lr, **_time_scalars(run)}, step=s.step)

    def on_eval_end(self, run: Run) -> None:
        import mlflow

        s = run.state
        mlflow.log_metrics({f"eval_{k}": v for k, v in s.eval_metrics.items()}, step=s.step)

    def on_train_end(self, run: Run) -> None:
        import mlflow

        mlflow.end_run()


def _time_scalars(run: Run) -> dict[str, float]:
    """The last log interval's phase shares, samples/s and, on GPUs, the device's numbers
    (core/step_times.py); none when not timed."""
    times = run.last_times
    return times.scalars() if times is not None and times.steps else {}
