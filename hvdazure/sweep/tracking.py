"""MLflow for a sweep (--mlflow): one parent run for the sweep, one child run per trial under it (the trials'
MLflowLogger, core/loggers.py). Inside an Azure ML job the parent is the job's own run; elsewhere a run in
a SQLite store in the sweep's output folder, found again when the sweep is restarted."""

from __future__ import annotations

import json
import os
from typing import Any

from hvdazure.core.loggers import default_mlflow_uri
from hvdazure.sweep.options import SETTINGS_FILE, SweepOptions


def tracking_uri(options: SweepOptions) -> str:
    return default_mlflow_uri(options.output_dir)


def parent_run(options: SweepOptions) -> str:
    """The sweep's parent run id (created, or the one a previous start of this sweep recorded)."""
    import mlflow

    uri = tracking_uri(options)
    job_run, job_store = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
    if job_run and uri == job_store:
        return job_run
    settings_path = options.output_dir / SETTINGS_FILE
    settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}
    client = mlflow.MlflowClient(uri)
    if settings.get("mlflow_parent_run_id"):
        return settings["mlflow_parent_run_id"]
    experiment = client.get_experiment_by_name("hvdazure")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("hvdazure")
    run = client.create_run(experiment_id, run_name=f"sweep {options.output_dir.name}",
                            tags={"hvdazure.sweep": str(options.output_dir.resolve())})
    for key, value in options.to_dict().items():
        client.log_param(run.info.run_id, f"sweep.{key}", str(value))
    settings["mlflow_parent_run_id"] = run.info.run_id
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")
    return run.info.run_id


def log_best(options: SweepOptions, parent: str, best: dict[str, Any] | None, trials: int,
             finished: bool) -> None:
    """The sweep's outcome on its parent run: the best value and trial, how many trials ran; the run ends
    when the sweep did (not a stopped one, nor an Azure ML job's own run, which Azure ML ends)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri(options))
    if finished and parent != os.environ.get("MLFLOW_RUN_ID"):
        client.set_terminated(parent, "FINISHED")
    client.log_metric(parent, "sweep_trials", trials)
    if best is not None:
        client.log_metric(parent, f"best_{options.metric}", float(best["value"]))
        client.set_tag(parent, "best_trial", str(best["trial"]))
