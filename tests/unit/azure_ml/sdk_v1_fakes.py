"""The Azure ML services azureml-core (SDK v1) calls for a submission, faked over HTTP with `responses`:
`FakeService` answers them and records the calls, `serving()` routes every HTTPS request to one for a block's
time, `submit()` submits a JobSpec with SDK v1. The `service` fixture (conftest.py) serves one for a test's
time. Response shapes: tests/unit/fixtures/azure/README.md."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import responses
from fakes.azureml_jobs import FakeCredential  # azureml-core reads tenant and user from it

from hvdazure.azure import submission
from hvdazure.azure.spec.job import JobSpec
from hvdazure.azure.workspace import WorkspaceRef

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "azure"  # tests/unit/fixtures/azure
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


def submit(**overrides):
    spec = JobSpec(**{"script": "train.py", "compute": "gpu-cluster", "nodes": 2, "image": IMAGE,
                      "script_args": ["--set", "epochs=3"], **overrides})
    return submission.submit(spec, WorkspaceRef("sub-id", "rg", "ws"), sdk="v1", credential=FakeCredential())
