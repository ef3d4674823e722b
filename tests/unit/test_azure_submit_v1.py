"""End-to-end submission with the legacy SDK v1 (azureml-core), up to HTTP: nothing here reaches Azure.

azureml-core talks HTTP through requests only, so one `responses` recorder plays the whole service: ARM
(workspace), the regional discovery, history, content (snapshot) and execution services, and the storage
account. `Experiment.submit` ends in a `snapshotrun` POST whose `Configuration` is the run: the tests
assert on it (mpi processCountPerNode and nodeCount, script, arguments, Docker, image, variables).
Response shapes: tests/unit/fixtures/azure/README.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import responses
from fakes.azureml_jobs import FAKE_TOKEN, FakeCredential  # azureml-core reads tenant and user from it

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import InputSpec, JobSpec
from hvdazure.azure.workspace import WorkspaceRef

# azureml-core 1.61 uses APIs its dependencies deprecate (marshmallow fields, ruamel.yaml's loaders)
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
              pytest.mark.project(v1=True)]
FIXTURES = Path(__file__).parent / "fixtures" / "azure"
WS = "/subscriptions/sub-id/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"
IMAGE = "myacr.azurecr.io/hvdazure-gpu:0.1.0"
SAS_SIGNATURE = "FAKE-SAS-SIGNATURE"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class FakeService:
    """Every Azure ML service azureml-core calls for a submission, keyed by (method, URL pattern);
    `calls` records (method, URL without query, body)."""

    def __init__(self, computes: tuple[str, ...] = ("gpu-cluster",)) -> None:
        self.calls: list[tuple[str, str, object]] = []
        self.computes = computes
        self.blobs: dict[str, bytes] = {}

    def __call__(self, request):
        url = request.url.split("?")[0]
        body = request.body
        if isinstance(body, bytes) and url.startswith("https://eastus.experiments"):
            body = json.loads(body)
        self.calls.append((request.method, url, body))
        if "blob.core.windows.net" in url:
            return self._blob(request, url)
        status, answer = self._answer(request.method, url, request)
        return status, {}, json.dumps(answer)

    def _answer(self, method: str, url: str, request) -> tuple[int, object]:
        if url == "https://management.azure.com/subscriptions":
            return 200, fixture("v1_subscriptions.json")
        if url == "https://management.azure.com" + WS:
            return 200, fixture("v1_workspace.json")
        if url == "https://eastus.api.azureml.ms/discovery":
            return 200, fixture("v1_discovery.json")
        if match := re.search(r"/computes/([^/]+)$", url):
            if match.group(1) in self.computes:
                return 200, fixture("v1_compute_nd96asr.json")
            return 404, {"error": {"code": "NotFound", "message": "compute not found"}}
        if re.search(r"/history/v1\.0/.*/experiments/project$", url):
            return 200, fixture("v1_experiment.json")
        if url.endswith("/snapshots/latest/metadata"):
            return 200, {"id": None, "root": {}}  # no earlier snapshot
        if url.endswith("/snapshots/getblob"):
            names = json.loads(request.body)["FileNames"]
            sas = f"sv=2021-08-06&sr=b&sp=cw&sig={SAS_SIGNATURE}"
            return 200, {"fileNodes": [{"fullName": n, "blobUri": f"https://acct.blob.core.windows.net/snapshots/"
                                        f"{n}?{sas}"} for n in names]}
        if re.search(r"/content/v2\.0/.*/snapshots/[0-9a-f-]+$", url):
            return 200, {"id": url.rsplit("/", 1)[1]}
        if url.endswith("/snapshotrun"):
            return 200, _run(request.url.split("runId=")[1].split("&")[0])
        if match := re.search(r"/experiments/project/runs/([^/]+)$", url):
            patch = json.loads(request.body) if request.body else {}
            return 200, _run(match.group(1), patch.get("properties"))
        return 404, {"error": {"code": "NotFound", "message": f"{method} {url}"}}

    def _blob(self, request, url: str):
        headers = {"ETag": '"0x1"', "Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT",
                   "x-ms-request-server-encrypted": "true"}
        if request.method == "HEAD":
            if url not in self.blobs:
                return 404, {}, ""
            headers |= {"Content-Length": str(len(self.blobs[url])), "x-ms-blob-type": "BlockBlob"}
            return 200, headers, ""
        body = request.body or b""
        self.blobs[url] = body.encode() if isinstance(body, str) else bytes(body)
        return 201, headers, ""

    def snapshot_run(self) -> dict:
        (body,) = [b for m, u, b in self.calls if m == "POST" and u.endswith("/snapshotrun")]
        return body

    def kinds(self) -> list[str]:
        """The services called, in order, without repeats of the same kind in a row."""
        names = []
        for method, url, _ in self.calls:
            kind = (f"{method} blob" if "blob.core" in url else f"{method} " +
                    re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "ID", url.split("/workspaces/ws", 1)[-1]))
            if not names or names[-1] != kind:
                names.append(kind)
        return names


def _run(run_id: str, properties: dict | None = None) -> dict:
    return {"runId": run_id, "rootRunId": run_id, "runNumber": 1, "parentRunId": None,
            "runUuid": "22222222-0000-0000-0000-000000000000", "status": "NotStarted",
            "experimentId": "11111111-0000-0000-0000-000000000000", "createdUtc": "2026-01-01T00:00:00Z",
            "target": "gpu-cluster", "runType": "azureml.scriptrun", "name": None, "displayName": None,
            "description": None, "tags": {}, "properties": properties or {}, "hidden": False}


@contextmanager
def serving(fake: Any) -> Iterator[None]:
    """Every HTTPS request azureml-core makes answered by `fake` (a FakeService), for the block's time."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as recorder:
        for method in ("GET", "POST", "PUT", "PATCH", "HEAD"):
            recorder.add_callback(method, re.compile(r"https://.*"), callback=fake,
                                  content_type="application/json")
        yield


@pytest.fixture
def service():
    fake = FakeService()
    with serving(fake):
        yield fake


def submit(**overrides):
    spec = JobSpec(**{"script": "train.py", "compute": "gpu-cluster", "nodes": 2, "image": IMAGE,
                      "script_args": ["--set", "epochs=3"], **overrides})
    return submission.submit(spec, WorkspaceRef("sub-id", "rg", "ws"), sdk="v1", credential=FakeCredential())


def test_experiment_submit_uploads_a_snapshot_then_posts_the_run(project, service):
    submitted = submit()

    kinds = service.kinds()
    steps = ("GET ", "GET /computes/gpu-cluster", "POST /snapshots/getblob", "PUT blob", "POST /snapshots/ID",
             "POST /experiments/project/snapshotrun")
    order = [kinds.index(step) for step in steps]
    assert order == sorted(order)
    assert submitted.sdk == "v1"
    assert re.fullmatch(r"project_\d+_[0-9a-f]{8}", submitted.name)
    assert submitted.studio_url.startswith(f"https://ml.azure.com/runs/{submitted.name}?wsid=")


def test_the_run_configuration_is_mpi_with_processes_per_node_and_nodes(project, service):
    submit(env={"NCCL_DEBUG": "INFO"}, shm_size="16g")

    configuration = service.snapshot_run()["Configuration"]
    assert configuration["mpi"] == {"processCountPerNode": 8, "nodeCount": 2}  # ND96asr_v4: 8 GPUs per node
    assert configuration["nodeCount"] == 2
    assert (configuration["script"], configuration["arguments"]) == ("train.py", ["--set", "epochs=3"])
    assert configuration["target"] == "gpu-cluster"
    assert configuration["docker"]["useDocker"] is True
    assert configuration["docker"]["shmSize"] == "16g"
    assert configuration["environment"]["docker"]["baseImage"] == IMAGE
    assert configuration["environment"]["python"]["userManagedDependencies"] is True
    assert configuration["environment"]["environmentVariables"] == {}  # not the SDK's EXAMPLE_ENV_VAR
    assert configuration["environmentVariables"] == {
        "OMPI_MCA_mpi_yield_when_idle": "1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        "UCX_IB_PCI_RELAXED_ORDERING": "on", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_conda_file_is_built_on_the_image_without_the_sdks_pip_defaults(project, service):
    (project / "env.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - rich==14.0.0\n")
    submit(conda_file="env.yml", processes_per_node=4)

    python = service.snapshot_run()["Configuration"]["environment"]["python"]
    assert python["userManagedDependencies"] is False
    assert python["condaDependencies"]["dependencies"] == ["python=3.11", {"pip": ["rich==14.0.0"]}]
    assert "azureml-defaults" not in json.dumps(python)


def test_the_snapshot_is_the_code_directory(project, service):
    submit()

    uploaded = {u.rsplit("/", 1)[1] for m, u, _ in service.calls if m == "PUT" and "blob.core" in u}
    assert uploaded == {"train.py"}


def test_nothing_printed_holds_the_sas_signature_or_the_token(project, service, capsys):
    submit()

    printed = capsys.readouterr()
    assert SAS_SIGNATURE not in printed.out + printed.err
    assert FAKE_TOKEN not in printed.out + printed.err


def test_an_unknown_compute_stops_before_the_snapshot(project, service):
    with pytest.raises(SubmitError, match="compute 'cpu-cluster' not found in the workspace"):
        submit(compute="cpu-cluster")

    assert not [u for m, u, _ in service.calls if "snapshot" in u or "blob.core" in u]


def test_the_run_is_named_described_and_bounded_as_asked(project, service):
    submitted = submit(name="digits-v1", description="digits, two nodes", max_duration=7200)

    assert submitted.name == "digits-v1"  # the snapshotrun POST's runId, which the fake service echoes
    assert service.snapshot_run()["Configuration"]["maxRunDurationSeconds"] == 7200
    patches = [json.loads(b) for m, u, b in service.calls if m == "PATCH" and u.endswith("/runs/digits-v1")]
    assert {"runId": "digits-v1", "description": "digits, two nodes"} in patches  # once the run exists


def test_inputs_are_refused_with_v1_before_any_request(project, service):
    with pytest.raises(JobSpecError, match="--input and --output need SDK v2"):
        submit(inputs=[InputSpec("data", "azureml:digits@latest")], script_args=["${{inputs.data}}"])

    assert service.calls == []


# --- SDK v1 is past its end of support: one line says so ----------------------------------------------------
def _end_of_support_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "end of support" in line]


def test_a_v1_submission_says_once_that_v1_is_past_its_end_of_support(project, service, capsys):
    submit()

    lines = _end_of_support_lines(capsys.readouterr().err)
    assert lines == [f"hvdazure: warning: {submission.V1_END_OF_SUPPORT}"]
    assert "azureml-core" in lines[0] and "(2026-06-30)" in lines[0]
    assert "v2 (azure-ai-ml) is the default" in lines[0] and "HyperDrive" in lines[0]


@pytest.mark.parametrize(("sdk", "told"), [("v1", 1), ("v2", 0)])
def test_the_dry_run_tells_the_end_of_support_for_v1_only(project, capsys, sdk, told):
    from hvdazure.cli import main

    assert main(["submit", "train.py", "--compute", "gpu-cluster", "-ppn", "1", "--image", IMAGE,
                 "--dry-run", "--sdk", sdk, "--output-yaml", "../job.yml"]) == 0

    assert len(_end_of_support_lines(capsys.readouterr().err)) == told
