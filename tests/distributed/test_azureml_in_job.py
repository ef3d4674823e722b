"""The trainer inside an Azure ML job, played on 2 local ranks: Azure ML's environment variables (the shapes
of tests/unit/fixtures/cluster_env/azureml_*.json, made-up values), checkpoints under ./outputs/checkpoints
of the job's folder, the job's MLflow run taken from the environment, resume=auto after a restart, and the
preemption watcher against a stand-in of the metadata service on 127.0.0.1 (fakes/metadata_service.py).

Nothing here ran in Azure. MLFLOW_TRACKING_URI points at a local SQLite store standing in for the workspace,
and scheduled_events_url at the stand-in: no test contacts 169.254.169.254 or any other address.
"""

import mlflow
import pytest
from fakes.metadata_service import FakeMetadataService, InSeconds, document, preempt
from harness import run_job

from hvdazure.core.checkpoint.store import CheckpointManager

JOB = "azureml_job.py"
# 37 samples, batch 4 on 2 ranks: 5 steps per epoch, 20 in all; slow enough for the watcher to see a timeline
SETTINGS = ("epochs=4", "batch_size=4", "extra.n_train=37", "lr=0.05", "mlflow=true", "resume=auto",
            "extra.step_sleep=0.25")
STEPS = 20
OTHER_VM_IMMINENT = document(4, preempt("P-other", "vm-1"))


def _phase(doc, polls):
    return [doc] * polls


class AzureMLJob:
    """One Azure ML job: its folder, its MLflow run (created beforehand, as Azure ML does), its variables."""

    def __init__(self, tmp_path, name):
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.store = f"sqlite:///{tmp_path / 'workspace.db'}"
        client = mlflow.MlflowClient(self.store)
        experiment = client.get_experiment_by_name("job-experiment")
        experiment_id = experiment.experiment_id if experiment else client.create_experiment("job-experiment")
        self.run_id = client.create_run(experiment_id).info.run_id
        self.client = client
        self.env = {
            "AZUREML_RUN_ID": f"example_job_{name}",
            "AZ_BATCHAI_MPI_MASTER_NODE": "localhost",
            "MLFLOW_TRACKING_URI": self.store,
            "MLFLOW_RUN_ID": self.run_id,
            "MLFLOW_EXPERIMENT_ID": experiment_id,
            "HVDAZURE_VM_NAME": "",  # the name comes from the stand-in's compute/name
            "HVDAZURE_TEST_CWD": str(self.dir),
            "HVDAZURE_TEST_POLL": "0.05",  # 13 polls take well under the 5 s of training
        }
        self.attempts = 0

    def run(self, service):
        """Start (or restart) the job: `python train.py` on 2 MPI ranks, from the job's folder."""
        self.attempts += 1
        reports = self.dir.parent / f"{self.dir.name}-reports-{self.attempts}"
        reports.mkdir()
        args = [a for s in (*SETTINGS, f"scheduled_events_url={service.url}") for a in ("--set", s)]
        return run_job(JOB, *args, out_dir=reports, controller="mpi", env=self.env, timeout=240)

    def checkpoints(self):
        return CheckpointManager(str(self.dir / "outputs" / "checkpoints"))

    def logged_steps(self, metric="train_loss"):
        return sorted(m.step for m in self.client.get_metric_history(self.run_id, metric))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A job the watcher lets run to the end: this VM's notice withdrawn, other VMs' notices ignored."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    job = AzureMLJob(tmp, "job")
    timeline = (_phase(document(1), 3)
                + _phase(document(2, preempt("P-far", "vm-0", not_before=InSeconds(600))), 3)
                + _phase(document(3), 3)  # withdrawn
                + _phase(OTHER_VM_IMMINENT, 3)
                + [document(5, preempt("P-other", "vm-1", status="Started", not_before=""))])
    with FakeMetadataService(timeline, vm_name="vm-0") as service:
        result = job.run(service)
    return job, result, service, timeline


def test_a_withdrawn_notice_and_other_vms_notices_leave_training_running(uninterrupted):
    _, result, service, timeline = uninterrupted
    assert result.returncode == 0, result.output
    assert set(service.served()) == set(range(len(timeline)))  # every phase was seen while training
    assert result.output.count("watching Azure Scheduled Events for a preemption of vm-0") == 1  # rank 0
    assert "Azure preemption notice" not in result.output
    assert result.reports[0]["history"][-1]["step"] == STEPS


def test_checkpoints_go_to_outputs_checkpoints_of_the_jobs_folder(uninterrupted):
    job, *_ = uninterrupted
    checkpoint, _ = job.checkpoints().latest_valid()
    assert checkpoint is not None and checkpoint.step == STEPS
    assert checkpoint.manifest["world_size"] == 2


def test_rank_0_alone_logs_into_the_jobs_mlflow_run(uninterrupted):
    job, result, *_ = uninterrupted
    run = job.client.get_run(job.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2"
    assert job.logged_steps() == list(range(1, STEPS + 1))  # once per step: not once per rank
    assert run.data.metrics["lr"] == result.reports[0]["history"][-1]["lr"]


def test_a_preemption_notice_for_this_vm_checkpoints_exits_143_and_the_restart_resumes_exactly(
        tmp_path, uninterrupted):
    reference = uninterrupted[1].reports[0]
    job = AzureMLJob(tmp_path, "job")
    timeline = _phase(document(1), 3) + _phase(OTHER_VM_IMMINENT, 3) + [
        document(5, preempt("P-other", "vm-1"), preempt("P-this", "vm-0"))]
    with FakeMetadataService(timeline, vm_name="vm-0") as service:
        preempted = job.run(service)
        assert preempted.returncode == 143, preempted.output
        saved, _ = job.checkpoints().latest_valid()
        service.play([document(6)])  # the notice is gone when Azure ML runs the job again
        restarted = job.run(service)

    assert "Azure preemption notice for vm-0 (event P-this, Scheduled" in preempted.output
    assert "received Azure preemption notice for vm-0: saved checkpoint step-" in preempted.output
    assert "Traceback" not in preempted.output
    assert saved.manifest["reason"] == "signal: Azure preemption notice for vm-0"
    assert 0 < saved.step < STEPS
    assert not preempted.reports  # no rank ran to the end

    assert restarted.returncode == 0, restarted.output
    assert f"resumed from step-{saved.step:08d}" in restarted.output
    assert "MLflow run" not in restarted.output  # the same command: the same params, logged once
    assert restarted.reports[0]["params_sha256"] == reference["params_sha256"]
    assert restarted.reports[0]["history"] == reference["history"]
    assert job.client.get_run(job.run_id).info.status == "FINISHED"
    assert job.logged_steps() == list(range(1, STEPS + 1))  # the same run, continued after the restart
