"""End-to-end submission with SDK v2 (azure-ai-ml), up to HTTP: nothing here reaches Azure.

`MLClient(..., transport=...)` sends every ARM call to a fake workspace (FakeWorkspace) that records it;
the code upload builds its own blob client and ignores that transport, so the blob requests are recorded
at the requests level with `responses`. The tests assert on the order of the calls (compute lookup,
environment lookup and registration, code upload, job PUT) and on the job PUT's body, which is what Azure
ML would run. Response shapes: tests/unit/fixtures/azure/README.md.
"""

from __future__ import annotations

import json
import re
import types

import pytest
from azure.core.exceptions import ClientAuthenticationError
from sdk_v2_fakes import (
    IMAGE,
    PROJECT,
    SAS_SIGNATURE,
    WORKSPACE,
    WS,
    FakeCredential,
    RecordingTransport,
    submit,
)

from hvdazure.azure import submission
from hvdazure.azure.compute import ClusterSpec
from hvdazure.azure.errors import SubmitError
from hvdazure.azure.spec.job import InputSpec, JobSpec, OutputSpec, resolve
from hvdazure.azure.v2 import submit as submit_v2
from hvdazure.cli import main

# azure-ai-ml 1.35.2 defines marshmallow fields that marshmallow deprecates: hundreds of warnings per import
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), PROJECT]
def test_submission_looks_up_the_compute_registers_the_environment_uploads_the_code_then_puts_the_job(
        project, fake):
    submitted = submit(fake)

    version = next(p for m, p, _ in fake.calls if m == "PUT" and "/environments/" in p).rsplit("/", 1)[1]
    assert fake.arm_calls() == [
        ("GET", "/computes/gpu-cluster"),
        ("GET", f"/environments/hvdazure-gpu/versions/{version}"),
        ("PUT", f"/environments/hvdazure-gpu/versions/{version}"),
        ("GET", "/codes/*/versions"),  # is this content hash uploaded already?
        ("POST", "/codes/*/versions/1/startPendingUpload"),
        ("PUT", "/codes/*/versions/1"),
        ("PUT", "/jobs/*"),
    ]
    kinds = [p for _, p, _ in fake.calls]
    first_blob = next(i for i, p in enumerate(kinds) if p.startswith("blob:"))
    assert kinds.index("/computes/gpu-cluster") < first_blob < next(i for i, p in enumerate(kinds)
                                                                    if p.startswith("/jobs/"))
    (job_path,) = [p for m, p, _ in fake.calls if m == "PUT" and p.startswith("/jobs/")]
    assert (submitted.name, submitted.sdk) == (job_path.rsplit("/", 1)[1], "v2")
    assert submitted.studio_url.startswith(f"https://ml.azure.com/runs/{submitted.name}")


def test_the_job_put_is_an_mpi_job_of_nodes_times_processes_running_python_on_the_script(project, fake):
    submit(fake, env={"NCCL_DEBUG": "INFO"}, experiment="digits", display_name="digits 2x8", shm_size="16g")

    body = fake.job_put()
    assert body["jobType"] == "Command"
    # ND96asr_v4 has 8 GPUs: one rank each, set explicitly (without it the service runs one rank per node)
    assert body["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 8}
    assert body["resources"]["instanceCount"] == 2
    assert body["resources"]["shmSize"] == "16g"
    assert body["command"] == "python train.py --set epochs=3"  # Azure ML starts mpirun itself
    assert body["computeId"] == WS + "/computes/gpu-cluster"
    assert re.fullmatch(re.escape(WS) + r"/environments/hvdazure-gpu/versions/0\.1\.0-[0-9a-f]{12}",
                        body["environmentId"])
    assert re.fullmatch(re.escape(WS) + r"/codes/[^/]+/versions/1", body["codeId"])
    assert (body["experimentName"], body["displayName"]) == ("digits", "digits 2x8")
    assert body["environmentVariables"] == {
        "OMPI_MCA_mpi_yield_when_idle": "1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        "UCX_IB_PCI_RELAXED_ORDERING": "on", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_the_registered_environment_is_named_by_the_image_and_holds_it(project, fake):
    submit(fake)

    ((path, environment),) = fake.environments.items()
    assert path.startswith("/environments/hvdazure-gpu/versions/0.1.0-")
    assert environment["properties"]["image"] == IMAGE
    assert environment["properties"].get("isAnonymous") in (None, False)


def test_a_second_submission_of_the_same_image_reuses_the_environment(project, fake):
    submit(fake)
    fake.calls.clear()
    submit(fake)

    environment_calls = [c for c in fake.arm_calls() if "/environments/" in c[1]]
    assert [method for method, _ in environment_calls] == ["GET"]  # found: not registered again


def test_a_registered_environment_is_looked_up_before_the_upload_and_referenced_by_version(project, fake):
    fake.environments["/environments/team-env/versions/2"] = {
        "id": WS + "/environments/team-env/versions/2", "name": "2", "properties": {"image": IMAGE}}
    submit(fake, image=None, environment="azureml:team-env@latest")

    # looked up first: before the compute, the environment's registration or the upload
    assert fake.arm_calls()[0] == ("GET", "/environments/team-env/versions")
    assert ("GET", "/computes/gpu-cluster") in fake.arm_calls()[1:]
    assert fake.job_put()["environmentId"] == WS + "/environments/team-env/versions/2"


def test_an_unknown_registered_environment_stops_the_submission_before_the_upload(project, fake):
    with pytest.raises(SubmitError, match=r"^environment azureml:team-env:7 not found in the workspace$"):
        submit(fake, image=None, environment="azureml:team-env:7")

    assert not [p for _, p, _ in fake.calls if p.startswith(("blob:", "/codes/"))]


def test_the_upload_honours_amlignore(project, fake):
    submit(fake)

    uploaded = {p[len("blob:"):] for m, p, _ in fake.calls if m == "PUT" and p.startswith("blob:")}
    assert "project/train.py" in uploaded
    assert not any("big.bin" in p for p in uploaded)


def test_an_input_asset_is_resolved_to_its_version_and_mounted_read_only(project, fake):
    submit(fake, inputs=[InputSpec("data", "azureml:digits@latest")],
           script_args=["--set", "extra.data=${{inputs.data}}"])

    body = fake.job_put()
    assert body["inputs"]["data"]["mode"] == "ReadOnlyMount"
    assert body["inputs"]["data"]["uri"].endswith("/data/digits/versions/3")
    assert body["command"] == "python train.py --set 'extra.data=${{inputs.data}}'"


def test_the_job_put_is_named_described_bounded_queued_and_registers_its_outputs_as_asked(project, fake):
    submitted = submit(
        fake, compute="serverless", vm_size="Standard_NC24ads_A100_v4", name="digits-2x1",
        description="digits on two A100 nodes", max_duration=7200, job_tier="spot", priority="high",
        outputs=[OutputSpec("model", type="mlflow_model", mode="upload", asset_name="digits-model",
                            asset_version="3"), OutputSpec("ckpt", asset_name="digits-ckpt")],
        script_args=["--set", "checkpoint_dir=${{outputs.ckpt}}", "--set", "extra.model=${{outputs.model}}"])

    # the name is looked up first, serverless compute has no cluster to look up, and the PUT is the name's
    assert fake.calls[0][:2] == ("GET", "/jobs/digits-2x1")
    assert not [p for _, p, _ in fake.calls if p.startswith("/computes/")]
    assert [p for m, p, _ in fake.calls if m == "PUT" and p.startswith("/jobs/")] == ["/jobs/digits-2x1"]
    assert submitted.name == "digits-2x1"
    body = fake.job_put()
    assert body["description"] == "digits on two A100 nodes"
    assert body["limits"] == {"jobLimitsType": "Command", "timeout": "PT2H"}
    assert body["queueSettings"] == {"jobTier": "Spot", "priority": 3}
    assert "computeId" not in body  # no compute: Azure ML's serverless compute
    assert body["resources"]["instanceType"] == "Standard_NC24ads_A100_v4"
    assert (body["resources"]["instanceCount"], body["distribution"]["processCountPerInstance"]) == (2, 1)
    assert body["outputs"] == {
        "model": {"assetName": "digits-model", "assetVersion": "3", "mode": "Upload",
                  "jobOutputType": "mlflow_model"},
        "ckpt": {"assetName": "digits-ckpt", "mode": "ReadWriteMount", "jobOutputType": "uri_folder"}}


def test_a_name_the_workspace_has_already_stops_the_submission_before_the_upload(project, fake):
    submit(fake, name="digits-1")
    fake.calls.clear()

    with pytest.raises(SubmitError, match=r"^--name digits-1: the workspace has a job of that name already "
                                          r"\(names are unique\): choose another$"):
        submit(fake, name="digits-1")

    assert [call[:2] for call in fake.calls] == [("GET", "/jobs/digits-1")]


def test_processes_per_node_given_explicitly_win_over_the_vm_size(project, fake):
    submit(fake, processes_per_node=2)

    assert fake.job_put()["distribution"]["processCountPerInstance"] == 2


def test_an_unknown_compute_stops_the_submission_before_any_upload(project, fake):
    with pytest.raises(SubmitError, match="compute 'cpu-cluster' not found in the workspace: create it with"):
        submit(fake, compute="cpu-cluster")

    assert fake.arm_calls() == [("GET", "/computes/cpu-cluster")]


def test_create_compute_creates_a_missing_cluster_then_takes_the_processes_from_its_size(project, fake):
    spec = JobSpec(script="train.py", compute="nc-cluster", nodes=2, image=IMAGE)
    submission.submit(spec, WORKSPACE, credential=FakeCredential(),
                      create_compute=ClusterSpec("nc-cluster", "Standard_NC48ads_A100_v4", max_nodes=2),
                      client_options={"transport": RecordingTransport(fake)})

    assert fake.arm_calls()[:3] == [("GET", "/computes/nc-cluster"), ("GET", ""),  # the workspace's region
                                    ("PUT", "/computes/nc-cluster")]
    body = fake.job_put()
    assert body["distribution"]["processCountPerInstance"] == 2  # NC48ads A100 v4: 2 GPUs
    assert body["environmentVariables"]["NCCL_IB_DISABLE"] == "1"  # no InfiniBand on NC sizes


def test_missing_credentials_are_one_line_before_any_request(project, fake):
    class NoCredential:
        def get_token(self, *scopes, **kwargs):
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token.\nMore.")

    spec = JobSpec(script="train.py", compute="gpu-cluster", image=IMAGE, processes_per_node=1)
    with pytest.raises(SubmitError) as error:
        submission.submit(spec, WORKSPACE, credential=NoCredential(),
                          client_options={"transport": RecordingTransport(fake)})

    assert str(error.value).startswith("no Azure credentials: run `az login`")
    assert "\n" not in str(error.value)
    assert fake.calls == []


def test_a_failed_upload_is_one_line_without_the_sas_signature(project, fake, capsys):
    fake.refuse_uploads = True
    with pytest.raises(SubmitError) as error:
        submit(fake)

    printed = capsys.readouterr()
    assert SAS_SIGNATURE not in str(error.value) + printed.out + printed.err
    assert "\n" not in str(error.value)
    assert not [c for c in fake.arm_calls() if c[1].startswith("/jobs/")]


def test_nothing_printed_or_written_by_a_submission_holds_the_sas_signature_or_the_token(project, fake,
                                                                                         capsys):
    submit(fake)

    printed = capsys.readouterr()
    written = "".join(p.read_text(errors="replace") for p in project.rglob("*") if p.is_file())
    for secret in (SAS_SIGNATURE, "fake-arm-token"):
        assert secret not in printed.out + printed.err + written
    assert not any(SAS_SIGNATURE in json.dumps(b) for m, p, b in fake.calls if p.startswith("/jobs/"))


def test_the_cli_prints_the_job_name_and_studio_url(project, fake, monkeypatch, capsys):
    real_client = submit_v2.client
    monkeypatch.setattr("hvdazure.azure.workspace.default_credential", FakeCredential)
    monkeypatch.setattr("hvdazure.azure.v2.submit.client",
                        lambda ws, cred, **kw: real_client(ws, cred, transport=RecordingTransport(fake)))
    code = main(["submit", "train.py", "--compute", "gpu-cluster", "--nodes", "2", "--image", IMAGE,
                 "--subscription", "sub-id", "--resource-group", "rg", "--workspace", "ws", "--json",
                 "--", "--set", "epochs=3"])

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["sdk"] == "v2"
    assert result["studio_url"] == f"https://ml.azure.com/runs/{result['name']}?wsid={WS}"
    assert fake.job_put()["command"] == "python train.py --set epochs=3"


def test_compute_create_creates_a_cluster_that_scales_to_zero(fake):
    info = submission.create_compute(
        ClusterSpec("nc-cluster", "Standard_NC48ads_A100_v4", max_nodes=3, low_priority=True), WORKSPACE,
        credential=FakeCredential(), client_options={"transport": RecordingTransport(fake)})

    (put,) = [b for m, p, b in fake.calls if m == "PUT" and p == "/computes/nc-cluster"]
    properties = put["properties"]["properties"]
    assert put["properties"]["computeType"] == "AmlCompute"
    assert properties["vmSize"] == "Standard_NC48ads_A100_v4"
    assert properties["vmPriority"] == "LowPriority"
    assert properties["scaleSettings"] == {"maxNodeCount": 3, "minNodeCount": 0,
                                           "nodeIdleTimeBeforeScaleDown": "PT10M"}
    assert info.created
    assert info.describe().startswith("compute nc-cluster created: Standard_NC48ads_A100_v4, 2 GPU(s)")


def test_compute_create_keeps_an_existing_cluster(fake):
    cluster = ClusterSpec("gpu-cluster", "Standard_ND96asr_v4", max_nodes=8)
    info = submission.create_compute(cluster, WORKSPACE, credential=FakeCredential(),
                                     client_options={"transport": RecordingTransport(fake)})

    assert fake.arm_calls() == [("GET", "/computes/gpu-cluster")]
    assert (info.created, info.vm_size, info.max_nodes) == (False, "STANDARD_ND96ASR_V4", 4)


def test_stream_follows_the_logs_of_the_job_just_created(project, tmp_path):
    """Wiring only: streaming needs a live run (azure-ai-ml polls the run's logs), which no test here has."""
    streamed = []

    class Jobs:
        def create_or_update(self, job):
            return types.SimpleNamespace(name="job-1", studio_url="https://ml.azure.com/runs/job-1")

        def stream(self, name):
            streamed.append(name)

    client = types.SimpleNamespace(jobs=Jobs(), environments=types.SimpleNamespace(get=lambda *a, **k: None))
    job = resolve(JobSpec(script="train.py", compute="cpu", processes_per_node=1, image=IMAGE))
    files = submit_v2.V2Sdk().write_yaml(job, tmp_path / "job.yml")

    assert submit_v2.V2Connection(client).submit(job, files, stream=True).name == "job-1"
    assert streamed == ["job-1"]
