"""A fake Azure ML workspace for SDK v2 (azure-ai-ml) submissions: `FakeWorkspace`, the ARM side of
workspace `ws` and its blob store, answering through `RecordingTransport` (azure-core's transport, so the real
SDK runs up to HTTP); `submit()`, a JobSpec submitted to it. The `fake` fixture (conftest.py) serves one for
a test's time. Response shapes: tests/unit/fixtures/azure/README.md."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests
from azure.core.credentials import AccessToken, AccessTokenInfo
from azure.core.pipeline.transport import RequestsTransport
from fakes.azureml_jobs import transport_response

from hvdazure.azure import submission
from hvdazure.azure.spec.job import JobSpec
from hvdazure.azure.workspace import WorkspaceRef

# the `project` (conftest.py) of test_azure_submit_v2's and test_azure_inputs' tests: a data folder
# its .amlignore leaves out
PROJECT = pytest.mark.project(files={"data/big.bin": b"x" * 1000, ".amlignore": "data/\n"})
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "azure"  # tests/unit/fixtures/azure
WS = "/subscriptions/sub-id/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"
WORKSPACE = WorkspaceRef("sub-id", "rg", "ws")
IMAGE = "myacr.azurecr.io/hvdazure-gpu:0.1.0"
SAS_SIGNATURE = "FAKE-SAS-SIGNATURE"
BLOB_HOST = re.compile(r"https://acct\.blob\.core\.windows\.net/.*")


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class FakeCredential:
    """Hands out a fixed token; counts the requests for one."""

    def __init__(self) -> None:
        self.requests = 0

    def get_token(self, *scopes, **kwargs) -> AccessToken:
        self.requests += 1
        return AccessToken("fake-arm-token", int(time.time()) + 3600)

    def get_token_info(self, *scopes, options=None) -> AccessTokenInfo:
        self.requests += 1
        return AccessTokenInfo("fake-arm-token", int(time.time()) + 3600)


class FakeWorkspace:
    """The ARM side of workspace `ws`, as far as a command-job submission goes, and the regional discovery
    document and Run History's run records, where `hvdazure jobs`' client reads a job (`--resume-from`).
    Every request is appended to `calls` as (method, path below the workspace, JSON body); blob requests
    join the same list."""

    def __init__(self, computes: dict[str, str] | None = None) -> None:
        self.calls: list[tuple[str, str, dict | None]] = []
        computes = computes or {"gpu-cluster": "v2_compute_nd96asr.json"}
        self.computes = {name: fixture(f) for name, f in computes.items()}
        self.environments: dict[str, dict] = {}
        self.data_assets: dict[str, list[str]] = {"digits": ["1", "3"]}  # versions, oldest first
        self.blobs: dict[str, bytes] = {}
        self.jobs: dict[str, dict] = {}  # by name, as created
        self.runs: dict[str, dict] = {}  # Run History's records, by job name
        self.refuse_uploads = False  # the storage account answers 403, naming the URL (with its SAS)

    def answer(self, method: str, url: str, body: dict | None) -> tuple[int, dict]:
        path = url.split("?")[0].split(WS, 1)[-1]
        self.calls.append((method, path, body))
        arm_id = WS + path
        if path == "":
            return 200, fixture("v2_workspace.json")
        if url.endswith("/discovery"):  # the workspace's regional services (its discoveryUrl)
            return 200, fixture("v1_discovery.json")
        if match := re.fullmatch(r"/runs/([^/]+)", path):  # Run History's record of a job
            return (200, self.runs[match[1]]) if match[1] in self.runs else _not_found(path)
        if match := re.fullmatch(r"/computes/([^/]+)", path):
            name = match.group(1)
            if method == "PUT":
                self.computes[name] = {"id": arm_id, "name": name, "location": "eastus",
                                       "properties": {**body["properties"], "provisioningState": "Succeeded"}}
            return (200, self.computes[name]) if name in self.computes else _not_found(path)
        if match := re.fullmatch(r"/environments/([^/]+)/versions", path):  # newest first, as asked
            prefix = f"/environments/{match.group(1)}/"
            found = [e for p, e in self.environments.items() if p.startswith(prefix)]
            return 200, {"value": found[::-1]}
        if re.fullmatch(r"/environments/[^/]+/versions/[^/]+", path):
            if method == "PUT":
                self.environments[path] = {"id": arm_id, "name": path.rsplit("/", 1)[1],
                                           "properties": body["properties"]}
                return 201, self.environments[path]
            return (200, self.environments[path]) if path in self.environments else _not_found(path)
        if re.fullmatch(r"/codes/[^/]+/versions", path):
            return 200, {"value": []}  # no code version with this content hash yet
        if path.endswith("/startPendingUpload"):
            return 200, fixture("v2_pending_upload.json")
        if re.fullmatch(r"/codes/[^/]+/versions/[^/]+", path) and method == "PUT":
            return 200, {"id": arm_id, "name": path.rsplit("/", 1)[1], "properties": body["properties"]}
        if path == "/datastores/workspaceblobstore":  # where azure-ai-ml uploads a local input
            return 200, fixture("v2_datastore_blob.json")
        if match := re.fullmatch(r"/data/([^/]+)", path):
            if match.group(1) not in self.data_assets:
                return _not_found(path)
            latest = self.data_assets[match.group(1)][-1]
            return 200, {"id": arm_id, "name": match.group(1), "properties": {"latestVersion": latest}}
        if match := re.fullmatch(r"/data/([^/]+)/versions/([^/]+)", path):
            if match.group(2) not in self.data_assets.get(match.group(1), []):
                return _not_found(path)
            return 200, {"id": arm_id, "name": path.rsplit("/", 1)[1],
                         "properties": {"dataType": "uri_folder",
                                        "dataUri": "azureml://datastores/workspaceblobstore/paths/digits/"}}
        if match := re.fullmatch(r"/jobs/([^/]+)", path):
            name = match.group(1)
            if method == "GET":
                return (200, self.jobs[name]) if name in self.jobs else _not_found(path)
            properties = {**body["properties"], "status": "Starting", "services": {"Studio": {
                "jobServiceType": "Studio", "endpoint": f"https://ml.azure.com/runs/{name}?wsid={WS}"}}}
            self.jobs[name] = {"id": arm_id, "name": name, "properties": properties,
                               "type": "Microsoft.MachineLearningServices/workspaces/jobs"}
            return 201, self.jobs[name]
        return _not_found(path)

    def blob(self, request: requests.PreparedRequest):
        """The storage account: PUT stores, HEAD finds; the SAS query is recorded as sent. A code upload is
        recorded by its path below the pending upload, any other (a local input's) by its full URL."""
        key = request.url.split("?")[0]
        self.calls.append((request.method, "blob:" + key.split("/LocalUpload/0001/", 1)[-1], None))
        headers = {"ETag": '"0x1"', "Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT",
                   "x-ms-request-server-encrypted": "true"}
        if self.refuse_uploads and request.method == "PUT":
            return 403, {"x-ms-error-code": "AuthenticationFailed"}, f"<Error>denied: {request.url}</Error>"
        if request.method == "HEAD":
            if key not in self.blobs:
                return 404, {}, ""
            headers |= {"Content-Length": str(len(self.blobs[key])), "x-ms-blob-type": "BlockBlob"}
            return 200, headers, ""
        if "comp=metadata" not in request.url:
            body = request.body or b""
            self.blobs[key] = body.encode() if isinstance(body, str) else bytes(body)
        return (200 if "comp=" in request.url else 201), headers, ""

    def arm_calls(self) -> list[tuple[str, str]]:
        return [(m, _kind(p)) for m, p, _ in self.calls if not p.startswith("blob:")]

    def job_put(self) -> dict:
        (body,) = [b for m, p, b in self.calls if m == "PUT" and p.startswith("/jobs/")]
        return body["properties"]


def _not_found(path: str) -> tuple[int, dict]:
    return 404, {"error": {"code": "ResourceNotFound", "message": f"{path} not found"}}


def _kind(path: str) -> str:
    """A call's path without its generated parts (code asset ids, job names), for sequence checks."""
    path = re.sub(r"/codes/[^/]+", "/codes/*", path)
    return re.sub(r"/jobs/[^/]+", "/jobs/*", path)


class RecordingTransport(RequestsTransport):
    """azure-core transport that answers from a FakeWorkspace instead of the network."""

    def __init__(self, workspace: FakeWorkspace) -> None:
        super().__init__()
        self.workspace = workspace

    def send(self, request, **kwargs):
        raw = getattr(request, "content", None) or getattr(request, "body", None) or b""
        body = json.loads(raw) if raw else None
        status, answer = self.workspace.answer(request.method, request.url, body)
        return transport_response(request, status, {"Content-Type": "application/json"},
                                  json.dumps(answer).encode(), stream=bool(kwargs.get("stream")))


def submit(fake: FakeWorkspace, **overrides):
    spec = JobSpec(**{"script": "train.py", "compute": "gpu-cluster", "nodes": 2, "image": IMAGE,
                      "script_args": ["--set", "epochs=3"], **overrides})
    return submission.submit(spec, WORKSPACE, credential=FakeCredential(),
                             client_options={"transport": RecordingTransport(fake)})
