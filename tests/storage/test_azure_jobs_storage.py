"""`hvdazure jobs download`, `show` and `stream` against Azurite standing in for the workspace's storage
account, both SDKs up to HTTP (tests/fakes/azureml_jobs.py plays the Azure ML services). Nothing here ran in
Azure: the checkpoints are written by hvdazure's checkpoint manager straight into the containers, in the
places Azure ML keeps a job's files, and the tests check what comes back.

Where things are, as Azure ML lays them out (the fixtures' job, digits_1767225600_a1b2c3d4):
- the job's own files in the artifact store's container (`azureml`, here a fresh one per test):
  ExperimentRun/dcid.NAME/outputs/checkpoints/... (the trainer's default in a job), .../user_logs/std_log.txt;
- its output `ckpt` on workspaceblobstore at the path the job was given (runs/digits/, its v2 output URI
  azureml://datastores/workspaceblobstore/paths/runs/digits/).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient
from fakes.azureml_jobs import JOB, AzureMLJobs, FakeCredential, JobsTransport, serving

from hvdazure.azure import jobs
from hvdazure.azure.sdk import V1_END_OF_SUPPORT
from hvdazure.azure.workspace import WorkspaceRef
from hvdazure.cli import main
from hvdazure.core.checkpoint.store import CheckpointManager
from storage.azurite import Azurite, forget_filesystems, use_connection_string

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
WORKSPACE = WorkspaceRef("sub-id", "rg", "ws")
RUN_FILES = f"ExperimentRun/dcid.{JOB}"
PREEMPTION_ERROR = ("AzureMLCompute job failed.\nPreemptionError: Nodes of this job got pre-empted. Check if "
                    "the run has failed or restarted. Reason: Received pre-emption warning signal")
SDKS = ["v2", "v1"]


@dataclass
class Workspace:
    """The fake Azure ML services, with Azurite as their storage account."""

    service: AzureMLJobs
    azurite: Azurite
    blobstore: str  # workspaceblobstore's container
    artifacts: str  # workspaceartifactstore's container

    def url(self, container: str, path: str) -> str:
        return f"abfs://{container}/{path}"

    def put(self, container: str, name: str, data: bytes) -> None:
        ContainerClient.from_connection_string(self.azurite.connection_string(), container) \
            .upload_blob(name, data, overwrite=True)

    def get(self, container: str, name: str) -> bytes:
        return ContainerClient.from_connection_string(self.azurite.connection_string(), container) \
            .download_blob(name).readall()

    def client(self, sdk: str) -> jobs.JobsClient:
        options = {"transport": JobsTransport(self.service)} if sdk == "v2" else {}
        return jobs.connect(sdk, WORKSPACE, FakeCredential(), options)


@pytest.fixture
def workspace(azurite: Azurite, monkeypatch, tmp_path) -> Iterator[Workspace]:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # azureml-core's caches
    (tmp_path / "home" / ".azureml").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    use_connection_string(monkeypatch, azurite.connection_string())  # the test's own writes (abfs://)
    blobstore, artifacts = azurite.create_container(), azurite.create_container()
    service = AzureMLJobs(blob=azurite, containers={"workspaceblobstore": blobstore,
                                                    "workspaceartifactstore": artifacts})
    with serving(service):
        yield Workspace(service, azurite, blobstore, artifacts)
    forget_filesystems()


def save(url: str, *steps: int) -> None:
    manager = CheckpointManager(url, keep_last=10)
    for step in steps:
        weights = bytes(range(256)) * 16 + f"step {step}".encode()
        files = {"model.bin": lambda f, w=weights: f.write(w), "state.json": lambda f: f.write(b"{}")}
        manager.save(step, files, {"framework": "test"})


@pytest.fixture
def job_files(workspace: Workspace) -> Workspace:
    """The job's files (checkpoints in ./outputs/checkpoints, a metrics file, a log) and its output ckpt."""
    save(workspace.url(workspace.artifacts, f"{RUN_FILES}/outputs/checkpoints"), 4, 8)
    workspace.put(workspace.artifacts, f"{RUN_FILES}/outputs/metrics.json", b'{"loss": 0.1}')
    workspace.put(workspace.artifacts, f"{RUN_FILES}/user_logs/std_log.txt", b"epoch 1\nepoch 2\n")
    save(workspace.url(workspace.blobstore, "runs/digits"), 10, 20)
    return workspace


# --- download -----------------------------------------------------------------------------------------------
def test_v2_download_brings_files_and_outputs_and_verifies_every_checkpoint(job_files, tmp_path):
    downloaded = jobs.download_job(job_files.client("v2"), JOB, to=tmp_path / "d")

    assert downloaded.failure() is None
    to = tmp_path / "d"
    assert (to / "artifacts" / "outputs" / "metrics.json").read_bytes() == b'{"loss": 0.1}'
    assert (to / "artifacts" / "user_logs" / "std_log.txt").read_text() == "epoch 1\nepoch 2\n"
    checks = {str(c.directory.relative_to(to)): c for c in downloaded.checks}
    assert checks["artifacts/outputs/checkpoints"].valid == ("step-00000004", "step-00000008")
    assert checks["named-outputs/ckpt"].valid == ("step-00000010", "step-00000020")
    assert checks["named-outputs/ckpt"].latest == "step-00000020"
    found, _ = CheckpointManager(str(to / "named-outputs" / "ckpt")).latest_valid()
    assert found.step == 20
    assert sorted(p.name for p in to.iterdir()) == ["artifacts", "named-outputs"]  # no staging left


def test_v2_download_asks_where_each_output_is_then_lists_and_reads_its_blobs(job_files, tmp_path):
    jobs.download_job(job_files.client("v2"), JOB, to=tmp_path / "d")

    calls = job_files.service.calls
    (run_data,) = [c for c in calls if c.path == "/rundata"]
    assert (run_data.method, run_data.body["runId"]) == ("POST", JOB)
    assert run_data.body["selectRunMetadata"] is True
    (resolve,) = [c for c in calls if c.service == "data"]
    assert resolve.method == "POST" and resolve.path.endswith("/dataversion/batchGetResolvedUris")
    assert [v.rsplit("/", 3)[-3] for v in resolve.body["values"]] == [f"azureml_{JOB}_output_data_ckpt"]
    secrets = [c for c in calls if c.path.endswith("/listSecrets")]
    assert secrets and all(c.method == "POST" and c.body["expirableSecret"] is True for c in secrets)
    listings = {c.query for c in calls if c.service == "blob" and "comp=list" in c.query}
    assert "restype=container&comp=list&prefix=runs/digits/" in listings
    assert f"restype=container&comp=list&prefix={RUN_FILES}" in listings


def test_v2_download_of_one_output_brings_only_it(job_files, tmp_path):
    downloaded = jobs.download_job(job_files.client("v2"), JOB, output="ckpt", to=tmp_path / "d")

    assert [p.relative_to(tmp_path / "d") for p in downloaded.parts] == [Path("named-outputs/ckpt")]
    assert sorted(p.name for p in (tmp_path / "d" / "named-outputs" / "ckpt").iterdir()) == [
        "latest", "step-00000010", "step-00000020"]
    assert not (tmp_path / "d" / "artifacts").exists()


@pytest.mark.parametrize("sdk", SDKS)
def test_a_damaged_checkpoint_is_reported_in_one_line_and_renamed(job_files, tmp_path, sdk, monkeypatch,
                                                                  capsys):
    # the newest checkpoint among the job's files loses its last byte in storage
    name = f"{RUN_FILES}/outputs/checkpoints/step-00000008/model.bin"
    job_files.put(job_files.artifacts, name, job_files.get(job_files.artifacts, name)[:-1])
    monkeypatch.setattr("hvdazure.azure.workspace.default_credential", FakeCredential)
    real = jobs.connect
    monkeypatch.setattr(jobs, "connect", lambda s, w=None, c=None, o=None: real(
        s, w, c, {"transport": JobsTransport(job_files.service)} if s == "v2" else {}))

    code = main(["jobs", "download", JOB, "--to", str(tmp_path / "d"), "--sdk", sdk, "--json",
                 "--subscription", "sub-id", "--resource-group", "rg", "--workspace", "ws"])

    printed = capsys.readouterr()
    assert code == 2
    # --sdk v1 first says, as every v1 command does, that azureml-core is past its end of support
    told = [f"hvdazure: warning: {V1_END_OF_SUPPORT}"] if sdk == "v1" else []
    *warnings_first, line = printed.err.strip().splitlines()
    assert warnings_first == told
    checkpoints = tmp_path / "d" / "artifacts" / "outputs" / "checkpoints"
    assert line.startswith(f"hvdazure: error: job {JOB}: checkpoint step-00000008 in {checkpoints} is "
                           "damaged (")
    assert line.endswith("renamed step-00000008.damaged, which no reader takes for a checkpoint; newest "
                         "valid checkpoint there: step-00000004")
    answer = json.loads(printed.out)
    assert answer["exit_code"] == 2 and answer["error"] == line.removeprefix("hvdazure: error: ")
    assert (checkpoints / "step-00000008.damaged").is_dir() and not (checkpoints / "step-00000008").exists()
    found, warnings = CheckpointManager(str(checkpoints)).latest_valid()  # what a resume from here takes
    assert found.name == "step-00000004" and warnings


def test_v1_download_brings_the_runs_files_through_the_artifact_service(job_files, tmp_path):
    downloaded = jobs.download_job(job_files.client("v1"), JOB, to=tmp_path / "d")

    assert downloaded.failure() is None
    to = tmp_path / "d" / "artifacts"
    assert (to / "outputs" / "metrics.json").read_bytes() == b'{"loss": 0.1}'
    assert (to / "user_logs" / "std_log.txt").read_text() == "epoch 1\nepoch 2\n"
    (check,) = downloaded.checks
    assert check.directory == to / "outputs" / "checkpoints"
    assert check.valid == ("step-00000004", "step-00000008")
    artifact_calls = job_files.service.paths("artifact")
    assert ("GET", f"/artifacts/prefix/contentinfo/{RUN_FILES}/") in artifact_calls
    blob_reads = {p for m, p in job_files.service.paths("blob")}
    assert f"{job_files.artifacts}/{RUN_FILES}/outputs/checkpoints/step-00000008/model.bin" in blob_reads


def test_an_output_without_a_path_is_found_where_azure_ml_puts_it(job_files, tmp_path):
    job_files.service.jobs[JOB]["properties"]["outputs"]["ckpt"]["uri"] = None  # Azure ML chooses the place
    save(job_files.url(job_files.blobstore, f"azureml/{JOB}/ckpt"), 3, 6)
    job_files.service.set_status(JOB, "Failed", error=PREEMPTION_ERROR)
    client = job_files.client("v2")

    assert jobs.show_job(client, JOB).preemption.last.step == 6
    downloaded = jobs.download_job(client, JOB, output="ckpt", to=tmp_path / "d")

    (check,) = downloaded.checks
    assert check.valid == ("step-00000003", "step-00000006")


# --- show: the step a preempted job reached -----------------------------------------------------------------
def test_v2_show_of_a_preempted_job_reads_the_step_from_its_checkpoint_output(job_files):
    job_files.service.set_status(JOB, "Failed", error=PREEMPTION_ERROR)

    report = jobs.show_job(job_files.client("v2"), JOB)

    assert report.report()[-1] == (
        f"preempted at step 20 (last checkpoint step-00000020 in output ckpt), resume with: hvdazure submit "
        f"train.py --compute gpu-cluster --nodes 2 --resume-from {JOB} ... -- --set epochs=10 --set "
        "'checkpoint_dir=${{outputs.ckpt}}'")
    # read: the pointer, then that checkpoint's manifest; no checkpoint downloaded
    reads = [p.split("/", 1)[1] for m, p in job_files.service.paths("blob") if "/" in p]
    assert reads == ["runs/digits/latest", "runs/digits/step-00000020/manifest.json"]


def test_v1_show_of_a_preempted_job_reads_the_step_from_its_files(job_files):
    job_files.service.set_status(JOB, "Failed", error=PREEMPTION_ERROR)

    report = jobs.show_job(job_files.client("v1"), JOB)

    assert report.preemption.last.step == 8
    assert report.report()[-1].startswith(
        "preempted at step 8 (last checkpoint step-00000008 in the job's outputs/checkpoints); not resumable "
        "with --resume-from: ")  # an SDK v1 run: the line says what to do instead


# --- stream -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sdk", SDKS)
def test_stream_prints_the_logs_until_the_job_ends(job_files, sdk, monkeypatch, capsys):
    from azure.ai.ml.operations._run_history_constants import RunHistoryConstants
    from azureml.core import Run

    for holder in (RunHistoryConstants, Run):  # the SDKs' polling waits, at their shortest
        monkeypatch.setattr(holder, "_WAIT_COMPLETION_POLLING_INTERVAL_MIN", 0)
        monkeypatch.setattr(holder, "_WAIT_COMPLETION_POLLING_INTERVAL_MAX", 0)
    job_files.service.set_status(JOB, "Running")
    client = job_files.client(sdk)
    job_files.service.runs_through(JOB, "Running", "Running", "Running", "Completed")

    streamed = jobs.stream_job(client, JOB)

    assert streamed.failure() is None
    assert streamed.report() == [f"job {JOB} ended: Completed"]
    assert "epoch 2" in capsys.readouterr().out


def test_a_stream_that_ends_in_failure_is_the_jobs_error_in_one_line(job_files, monkeypatch, capsys):
    from azure.ai.ml.operations._run_history_constants import RunHistoryConstants

    monkeypatch.setattr(RunHistoryConstants, "_WAIT_COMPLETION_POLLING_INTERVAL_MIN", 0)
    monkeypatch.setattr(RunHistoryConstants, "_WAIT_COMPLETION_POLLING_INTERVAL_MAX", 0)
    job_files.service.set_status(JOB, "Running")
    client = job_files.client("v2")
    job_files.service.runs_through(JOB, "Running", "Running", "Failed", error="Execution failed: exit 1")

    streamed = jobs.stream_job(client, JOB)

    assert streamed.failure() == f"job {JOB} ended Failed: UserError: Execution failed: exit 1"
    assert "epoch 2" in capsys.readouterr().out
