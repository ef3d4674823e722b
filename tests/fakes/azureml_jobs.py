"""A stand-in for the Azure ML services `hvdazure jobs` talks to, at the HTTP boundary: nothing here is a
double of hvdazure's own code, and no test that uses it claims a job ran in Azure.

`AzureMLJobs` answers both SDKs: azure-ai-ml's requests come through `JobsTransport` (MLClient's
`transport=`), azureml-core's through `responses` (`serving`), and each answer is JSON in the shape the
SDKs' models parse (tests/unit/fixtures/azure/README.md says where each shape comes from). Services played:
ARM (the workspace, its jobs, cancel, datastores and their secrets), the regional discovery document, Run
History (runs, run details, run data, the experiment's runs query), the data plane's output URIs, and the
artifact service (SDK v1's file lists, as blob SAS URLs). Every request is recorded in `calls` as
(method, service, path below the workspace, JSON body).

The storage account behind the datastores is Azurite when a test gives one (`blob=`): the account is
Azurite's own (`devstoreaccount1`), so requests to https://devstoreaccount1.blob.core.windows.net, which
azure-ai-ml builds from a datastore and the artifact service hands out, are forwarded to Azurite on
127.0.0.1 (`forward_blob`): as they are when the SAS of the fake artifact service's answers authorises
them; signed with the account's key (Azurite's well-known one, which the fake listSecrets hands out, as the
service hands out a datastore's key), they go on with an account SAS instead, since a shared-key signature
names the host it was made for and a SAS does not.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import re
import time
import types
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import requests
import responses
from azure.core.credentials import AccessToken, AccessTokenInfo
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.transport import RequestsTransport, RequestsTransportResponse
from azure.core.rest._requests_basic import RestRequestsTransportResponse

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "azure"
WS = "/subscriptions/sub-id/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"
JOB = "digits_1767225600_a1b2c3d4"  # the job of the fixtures
ACCOUNT = "devstoreaccount1"  # Azurite's account: the datastores' too, so their requests can go to Azurite
BLOB_HOST = f"https://{ACCOUNT}.blob.core.windows.net"
BLOBSTORE = "azureml-blobstore-00000000-0000-0000-0000-000000000001"  # workspaceblobstore's container
ARTIFACTS = "azureml"  # workspaceartifactstore's container: ExperimentRun/dcid.NAME/...
_REGION = ("https://eastus.api.azureml.ms", "https://eastus.experiments.azureml.net")


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


# azure-ai-ml and azureml-core read the tenant from the token, so the fake one is JWT-shaped (and unsigned)
FAKE_TOKEN = ".".join([_b64({"alg": "none", "typ": "JWT"}),
                       _b64({"tid": "tenant-id", "oid": "object-id", "upn": "user@example.com",
                             "aud": "https://management.azure.com/", "exp": int(time.time()) + 3600}),
                       "unsigned"])


class FakeCredential:
    """Hands out the fake token."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken(FAKE_TOKEN, int(time.time()) + 3600)

    def get_token_info(self, *scopes: str, options: Any = None) -> AccessTokenInfo:
        return AccessTokenInfo(FAKE_TOKEN, int(time.time()) + 3600)


@dataclass
class Call:
    method: str
    service: str  # arm, discovery, history, data, artifact, execution, blob
    path: str  # below the workspace (ARM, Run History, the data plane), or container/blob
    body: Any = None
    query: str = ""  # a blob request's (its SAS signature left out)


@dataclass
class AzureMLJobs:
    """The services of workspace `ws` as far as `hvdazure jobs` goes. `jobs` holds ARM job resources, `runs`
    Run History records, `details` SDK v1's run details, each by job name; `blob` an Azurite (with
    connection_string/endpoint) for the datastores and artifacts, whose containers are `containers` (by
    datastore: a test's own, where the fixtures name Azure's); `unreachable` makes every request fail as a
    dropped connection does."""

    blob: Any = None
    containers: dict[str, str] = field(default_factory=lambda: {"workspaceblobstore": BLOBSTORE,
                                                                "workspaceartifactstore": ARTIFACTS})
    jobs: dict[str, dict[str, Any]] = field(default_factory=lambda: {JOB: fixture("v2_job_command.json")})
    runs: dict[str, dict[str, Any]] = field(default_factory=lambda: {JOB: fixture("run_history_run.json")})
    details: dict[str, dict[str, Any]] = field(default_factory=lambda: {JOB: fixture("v1_run_details.json")})
    calls: list[Call] = field(default_factory=list)
    unreachable: bool = False
    progress: dict[str, list[str]] = field(default_factory=dict)  # statuses the next run details go through
    final_error: dict[str, str] = field(default_factory=dict)

    def runs_through(self, name: str, *statuses: str, error: str | None = None) -> None:
        """The job goes through `statuses`, one per request for its run details (where streaming polls); the
        last comes with Run History's `error`."""
        self.set_status(name, statuses[0])
        self.progress[name] = list(statuses[1:])
        if error:
            self.final_error[name] = error

    # --- what tests set up and read ----------------------------------------------------------------------
    def set_status(self, name: str, status: str, error: str | None = None,
                   warnings: tuple[str, ...] = ()) -> None:
        """The job's status everywhere the SDKs read it, with Run History's error and warnings."""
        self.jobs[name]["properties"]["status"] = status
        for record in (self.runs[name], self.details[name]):
            record["status"] = status
            record["error"] = {"error": {"code": "UserError", "message": error}} if error else None
            record["warnings"] = [{"source": "AzureMLCompute", "message": w} for w in warnings] or None

    def add_job(self, name: str, experiment: str = "digits", created: str = "2026-01-02T00:00:00+00:00",
                status: str = "Completed") -> None:
        """Another job, a copy of the fixture's under `name`."""
        job = copy.deepcopy(self.jobs[JOB])
        job["id"], job["name"] = f"{WS}/jobs/{name}", name
        job["properties"]["experimentName"] = experiment
        job["properties"]["status"] = status
        job["systemData"]["createdAt"] = created
        self.jobs[name] = job
        self.runs[name] = {**copy.deepcopy(self.runs[JOB]), "runId": name, "status": status,
                           "createdUtc": created}
        self.details[name] = {**copy.deepcopy(self.details[JOB]), "runId": name, "status": status}

    def paths(self, service: str | None = None) -> list[tuple[str, str]]:
        """(method, path) of the calls to `service` (all but discovery's when None), in order."""
        return [(c.method, c.path) for c in self.calls
                if (service is None and c.service != "discovery") or c.service == service]

    # --- the services --------------------------------------------------------------------------------------
    def answer(self, method: str, url: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        """The answer to one request: (status, JSON body, headers)."""
        service, path = _service_and_path(url)
        self.calls.append(Call(method, service, path, body))
        if service == "discovery":
            return 200, fixture("v1_discovery.json"), {}
        if service == "arm":
            return self._arm(method, path, url)
        if service == "history":
            return self._history(method, path, body)
        if service == "data":
            return self._data(body)
        if service == "artifact":
            return self._artifact(path)
        cancel = re.fullmatch(r"/experiments/[^/]+/runId/([^/]+)/cancel", path)
        if service == "execution" and (match := cancel):  # SDK v1's Run.cancel: the run's cancelUri
            if match[1] not in self.runs:
                return _not_found(path)
            self.set_status(match[1], "CancelRequested")
            return 200, {}, {}
        if url.startswith("https://management.azure.com/subscriptions?"):
            return 200, fixture("v1_subscriptions.json"), {}
        return _not_found(url)

    def _arm(self, method: str, path: str, url: str) -> tuple[int, Any, dict[str, str]]:
        if path == "":
            return 200, fixture("v2_workspace.json" if "2022-05-01" not in url else "v1_workspace.json"), {}
        if path == "/jobs" and method == "GET":  # newest first, as the service lists them
            listed = sorted(self.jobs.values(), key=lambda j: j["systemData"]["createdAt"], reverse=True)
            return 200, {"value": listed}, {}
        if match := re.fullmatch(r"/jobs/([^/]+)", path):
            job = self.jobs.get(match[1])
            return (200, job, {}) if job else _not_found(path)
        if match := re.fullmatch(r"/jobs/([^/]+)/cancel", path):
            if match[1] not in self.jobs:
                return _not_found(path)
            self.set_status(match[1], "CancelRequested")
            location = f"https://management.azure.com{WS}/operationResults/cancel-{match[1]}?api-version=2023-02-01-preview"
            return 202, None, {"Location": location, "Retry-After": "0"}
        if path.startswith("/operationResults/cancel-"):
            return 200, None, {}
        if path == "/datastores":  # `?isDefault=true`: the default one
            chosen = [s for s in self._datastores() if s["properties"]["isDefault"] or "isDefault" not in url]
            return 200, {"value": chosen}, {}
        if match := re.fullmatch(r"/datastores/([^/]+)", path):
            found = [s for s in self._datastores() if s["name"] == match[1]]
            return (200, found[0], {}) if found else _not_found(path)
        if re.fullmatch(r"/datastores/[^/]+/listSecrets", path):  # the account's key (Azurite's)
            return 200, fixture("v2_datastore_secrets_key.json"), {}
        return _not_found(path)

    def _history(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if match := re.fullmatch(r"/runs/([^/]+)", path):
            run = self.runs.get(match[1])
            return (200, run, {}) if run else _not_found(path)
        if path == "/rundata":  # SDK v2's jobs.download: where each output is, by its data asset
            run = self.runs.get(body["runId"])
            if run is None:
                return _not_found(path)
            outputs = {name: {"assetId": _asset_id(body["runId"], name), "type": "uri_folder"}
                       for name in self._outputs(body["runId"])}
            return 200, {"runMetadata": {**run, "outputs": outputs}, "runDefinition": None,
                         "jobSpecification": None, "systemSettings": None}, {}
        if re.fullmatch(r"/experimentids/[^/]+", path):
            return 200, {**fixture("v1_experiment.json"), "name": "digits"}, {}
        if match := re.fullmatch(r"/experiments/([^/]+)/runs:query", path):  # SDK v1's list, newest first
            found = sorted((r for n, r in self.runs.items() if self._experiment(n) == match[1]),
                           key=lambda r: r["createdUtc"], reverse=True)
            return 200, {"value": found[: body.get("top", 500)], "continuationToken": None}, {}
        if re.fullmatch(r"/experiments/[^/]+/runs/[^/]+/metricsingest/wait", path):  # Run.cancel's flush
            return 200, {}, {}
        if match := re.fullmatch(r"(?:/experiments/[^/]+)?/runs/([^/]+)/details", path):
            if self.progress.get(match[1]):
                status = self.progress[match[1]].pop(0)
                last = not self.progress[match[1]]
                self.set_status(match[1], status, error=self.final_error.get(match[1]) if last else None)
            details = self.details.get(match[1])
            return (200, details, {}) if details else _not_found(path)
        return _not_found(path)

    def _data(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        """The data plane's batchGetResolvedUris: each output asset's datastore URI (long form)."""
        values = {}
        for asset_id in body["values"]:
            job, output = re.fullmatch(r".*/data/azureml_(.+)_output_data_(.+)/versions/1", asset_id).groups()
            uri = self._outputs(job)[output]
            store, below = re.fullmatch(r"azureml://datastores/([^/]+)/paths/(.*)", uri).groups()
            values[asset_id] = {"uri": f"azureml://subscriptions/sub-id/resourcegroups/rg/workspaces/ws/"
                                       f"datastores/{store}/paths/{below}", "type": "uri_folder"}
        return 200, {"values": values}, {}

    def _artifact(self, path: str) -> tuple[int, Any, dict[str, str]]:
        """SDK v1's artifact service: the files under a prefix (or one file), as blob SAS URLs."""
        match = re.fullmatch(r"/artifacts/(prefix/)?contentinfo/(ExperimentRun/.*)", path)
        if match is None:
            return _not_found(path)
        names = self.blob_names(self.containers["workspaceartifactstore"], match[2]) if self.blob else []
        if not match[1]:  # one file
            if match[2] not in names:
                return _not_found(path)
            return 200, self._content_info(match[2]), {}
        return 200, {"value": [self._content_info(n) for n in names], "continuationToken": None}, {}

    def _content_info(self, name: str) -> dict[str, Any]:
        run_path = name.split("/", 2)[2]  # below ExperimentRun/dcid.NAME/
        container = self.containers["workspaceartifactstore"]
        return {"contentUri": f"{BLOB_HOST}/{container}/{name}?{self._container_sas(container)}",
                "origin": "ExperimentRun", "container": name.split("/")[1], "path": run_path}

    # --- the storage account (Azurite) ---------------------------------------------------------------------
    def forward_blob(self, request: requests.PreparedRequest) -> tuple[int, dict[str, str], bytes]:
        """A request to the datastores' account, sent on to Azurite: as it is when a SAS authorises it; one
        signed with the account's key (SharedKey, which signs for the host it was sent to, not Azurite's)
        is checked to be so signed and sent on with an account SAS instead."""
        import urllib3

        path, _, query = request.url[len(BLOB_HOST):].partition("?")
        kept = "&".join(p for p in query.split("&") if p.split("=")[0] in ("restype", "comp", "prefix"))
        self.calls.append(Call(request.method, "blob", path.lstrip("/"), query=urllib.parse.unquote(kept)))
        url = self.blob.endpoint() + request.url[len(BLOB_HOST):]
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        if "sig=" not in query:
            if not headers.pop("Authorization", "").startswith(f"SharedKey {ACCOUNT}:"):
                return 403, {"x-ms-error-code": "NoAuthenticationInformation"}, b""
            url += ("&" if query else "?") + self._account_sas()
        answer = urllib3.PoolManager().request(request.method, url, body=request.body, headers=headers,
                                               redirect=False)
        return answer.status, dict(answer.headers), answer.data

    def blob_names(self, container: str, prefix: str) -> list[str]:
        from azure.storage.blob import ContainerClient

        client = ContainerClient.from_connection_string(self.blob.connection_string(), container)
        return [b.name for b in client.list_blobs(name_starts_with=prefix)]

    def _account_sas(self) -> str:
        from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

        return generate_account_sas(ACCOUNT, self._key(), ResourceTypes(container=True, object=True),
                                    AccountSasPermissions(read=True, list=True),
                                    datetime.now(timezone.utc) + timedelta(hours=1))

    def _key(self) -> str:
        return str(fixture("v2_datastore_secrets_key.json")["key"])

    def _container_sas(self, container: str) -> str:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        return generate_container_sas(ACCOUNT, container, account_key=self._key(),
                                      permission=ContainerSasPermissions(read=True, list=True),
                                      expiry=datetime.now(timezone.utc) + timedelta(hours=1))

    # --- helpers -------------------------------------------------------------------------------------------
    def _datastores(self) -> list[dict[str, Any]]:
        stores = fixture("v2_datastores.json")["value"]
        for store in stores:
            store["properties"]["containerName"] = self.containers[store["name"]]
        return stores

    def _outputs(self, name: str) -> dict[str, str]:
        """Where each output is: the path it was given, else Azure ML's own place for it on the default
        datastore, azureml/JOB/OUTPUT/ (where azure-ai-ml's jobs.download also looks for one)."""
        outputs = self.jobs[name]["properties"]["outputs"]
        return {key: value.get("uri") or f"azureml://datastores/workspaceblobstore/paths/azureml/{name}/{key}/"
                for key, value in outputs.items() if key != "default"}

    def _experiment(self, name: str) -> str:
        return self.jobs[name]["properties"]["experimentName"]

    # --- `responses` callback: SDK v1 and the blob requests of either SDK ----------------------------------
    def __call__(self, request: requests.PreparedRequest) -> tuple[int, dict[str, str], bytes | str]:
        if self.unreachable:
            raise requests.ConnectionError(f"Failed to establish a new connection: [Errno 111] Connection "
                                           f"refused: {request.url.split('?')[0]}")
        if request.url.startswith(BLOB_HOST):
            if self.blob is None:
                return 404, {"x-ms-error-code": "ContainerNotFound"}, ""
            return self.forward_blob(request)
        raw = request.body
        body = json.loads(raw) if raw and raw[:1] in (b"{", "{", b"[", "[") else raw
        status, answer, headers = self.answer(request.method, request.url, body)
        return status, {"Content-Type": "application/json", **headers}, json.dumps(answer) if answer else ""


def _service_and_path(url: str) -> tuple[str, str]:
    bare = url.split("?")[0]
    if bare.startswith("https://management.azure.com") and WS in bare:
        return "arm", bare.split(WS, 1)[1]
    if bare.endswith("/discovery"):
        return "discovery", ""
    for prefix, service in (("/history/v1.0", "history"), ("/data/v1.0", "data"),
                            ("/artifact/v2.0", "artifact"), ("/execution/v1.0", "execution")):
        if bare.startswith(_REGION) and prefix in bare and WS in bare:
            path = bare.split(WS, 1)[1]
            return service, ("/rundata" if path == "/rundata" else path)
    return "other", bare


def _asset_id(job: str, output: str) -> str:
    return (f"azureml://locations/eastus/workspaces/00000000-0000-0000-0000-000000000001/data/"
            f"azureml_{job}_output_data_{output}/versions/1")


def _not_found(what: str) -> tuple[int, Any, dict[str, str]]:
    return 404, {"error": {"code": "ResourceNotFound", "message": f"{what} not found", "details": []}}, {}


class JobsTransport(RequestsTransport):
    """azure-core transport answering from an AzureMLJobs (SDK v2's MLClient: ARM, discovery, Run History,
    data plane); `unreachable` raises what a dropped connection raises."""

    def __init__(self, service: AzureMLJobs) -> None:
        super().__init__()
        self.service = service

    def send(self, request: Any, **kwargs: Any) -> Any:
        if self.service.unreachable:
            raise ServiceRequestError("<urllib3.connection.HTTPSConnection>: Failed to establish a new "
                                      "connection: [Errno 111] Connection refused")
        raw = getattr(request, "content", None) or getattr(request, "body", None) or b""
        if request.url.startswith(BLOB_HOST):  # a log azure-ai-ml reads through this pipeline
            status, headers, data = self.service.forward_blob(
                types.SimpleNamespace(method=request.method, url=request.url, headers=dict(request.headers),
                                      body=raw or None))
        else:
            status, answer, headers = self.service.answer(request.method, request.url,
                                                          json.loads(raw) if raw else None)
            headers = {"Content-Type": "application/json", **headers}
            data = json.dumps(answer).encode() if answer is not None else b""
        return transport_response(request, status, headers, data, stream=bool(kwargs.get("stream")))


def transport_response(request: Any, status: int, headers: dict[str, str], data: bytes, stream: bool) -> Any:
    """What an azure-core transport returns for `request`: the answer as a `requests` response, wrapped for
    the kind of request azure-core sent (a newer generated client's azure.core.rest one, or the older)."""
    response = requests.Response()
    response.status_code, response.url, response.reason = status, request.url, "fake"
    response.headers.update(headers)
    response.raw = io.BytesIO(data)
    if hasattr(request, "content"):  # an azure.core.rest request (newer generated clients)
        wrapped = RestRequestsTransportResponse(request=request, internal_response=response)
        if not stream:
            wrapped.read()
        return wrapped
    return RequestsTransportResponse(request, response)


@contextmanager
def serving(service: AzureMLJobs) -> Iterator[responses.RequestsMock]:
    """Every HTTPS request made with `requests` answered by `service` (SDK v1's, and the blob requests of
    either SDK); Azurite on 127.0.0.1 is reached directly."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as recorder:
        recorder.add_passthru("http://127.0.0.1")
        for method in ("GET", "POST", "PUT", "PATCH", "HEAD", "DELETE"):
            recorder.add_callback(method, re.compile(r"https://.*"), callback=service)
        yield recorder
