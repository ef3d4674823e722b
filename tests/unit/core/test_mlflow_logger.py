"""Which MLflow run rank 0 logs to inside an Azure ML job, where every rank sees the job's run in
MLFLOW_RUN_ID and the workspace's store in MLFLOW_TRACKING_URI. Local SQLite stores stand in for the
workspace: nothing here talks to Azure."""

from types import SimpleNamespace

import pytest

from hvdazure import TrainConfig
from hvdazure.core.loggers import MLflowLogger, default_mlflow_uri

mlflow = pytest.importorskip("mlflow")


def _trainer():
    return SimpleNamespace(config=TrainConfig(epochs=2), world_size=2, global_batch_size=64,
                           schedule=SimpleNamespace(peak_lr=0.1))


@pytest.fixture
def azure_ml_job(tmp_path, monkeypatch):
    """The job's run, created beforehand in a store standing in for the workspace, as Azure ML does."""
    uri = f"sqlite:///{tmp_path / 'workspace.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("job-experiment")
    run = client.create_run(experiment)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", experiment)
    yield SimpleNamespace(uri=uri, client=client, run_id=run.info.run_id)
    if mlflow.active_run():
        mlflow.end_run()


def test_inside_azure_ml_rank_0_logs_into_the_jobs_own_run(azure_ml_job):
    logger = MLflowLogger(default_mlflow_uri("outputs"))
    logger.on_train_start(_trainer())
    logger.on_train_end(_trainer())

    assert logger.mlflow_run.info.run_id == azure_ml_job.run_id
    run = azure_ml_job.client.get_run(azure_ml_job.run_id)
    assert run.data.params["world_size"] == "2" and run.info.status == "FINISHED"


def test_a_tracking_uri_of_the_users_own_inside_azure_ml_gets_a_run_there(azure_ml_job, tmp_path):
    mine = f"sqlite:///{tmp_path / 'mine.db'}"
    logger = MLflowLogger(mine)
    logger.on_train_start(_trainer())  # was: MlflowException "Run with id=<the job's run> not found"
    logger.on_train_end(_trainer())

    runs = mlflow.MlflowClient(mine).search_runs(
        [mlflow.MlflowClient(mine).get_experiment_by_name("hvdazure").experiment_id])
    assert [r.info.run_id for r in runs] == [logger.mlflow_run.info.run_id] != [azure_ml_job.run_id]
    assert runs[0].data.params["global_batch_size"] == "64"
    assert azure_ml_job.client.get_run(azure_ml_job.run_id).data.params == {}  # the job's run untouched


def test_a_restarted_job_keeps_its_runs_first_params_and_adds_new_ones(azure_ml_job, caplog_hvdazure):
    # Azure ML runs a preempted job again in the same run; a setting may differ between attempts
    azure_ml_job.client.log_param(azure_ml_job.run_id, "epochs", "1")  # the first attempt's
    logger = MLflowLogger(default_mlflow_uri("outputs"))
    logger.on_train_start(_trainer())  # was: MlflowException "Changing param values is not allowed"
    logger.on_train_end(_trainer())

    params = azure_ml_job.client.get_run(azure_ml_job.run_id).data.params
    assert params["epochs"] == "1" and params["world_size"] == "2"
    assert any("keeps the values of its first attempt for epochs" in m for m in caplog_hvdazure)


@pytest.fixture
def caplog_hvdazure():
    import logging

    from hvdazure.core.rank_logging import logger

    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def test_a_later_fit_of_the_same_trainer_logs_into_the_run_of_its_first(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLflowLogger(uri)
    logger.on_train_start(_trainer())
    logger.on_train_end(_trainer())
    first = logger.mlflow_run.info.run_id

    logger.on_train_start(_trainer())  # was: a second run
    logger.on_train_end(_trainer())

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("hvdazure").experiment_id])
    assert [r.info.run_id for r in runs] == [first] == [logger.mlflow_run.info.run_id]
