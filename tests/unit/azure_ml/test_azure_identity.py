"""`--identity user|managed|managed:CLIENT_ID`: the identity a job runs as, in what each SDK sends (SDK v2's
`identity`, SDK v1's credential passthrough), shown by the dry run and checked offline; and, inside the
job, the managed identity DefaultAzureCredential (the data and checkpoint layer's, through adlfs) takes.
The fake services of sdk_v2_fakes.py / sdk_v1_fakes.py record every request."""

from __future__ import annotations

import json
import re

import pytest
import requests
import responses
import yaml
from azure_project import make_project
from job_specs import IMAGE, spec, submit_v1, sweep
from sdk_v2_fakes import submit

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError
from hvdazure.azure.resolved_job import JobIdentity
from hvdazure.azure.spec.identity import parse_identity
from hvdazure.azure.spec.job import resolve
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
CLIENT_ID = "11111111-2222-3333-4444-555555555555"


pytestmark.append(pytest.mark.project(files={"space.yaml": "lr: {type: choice, values: [0.1, 0.01]}\n"}))


@pytest.fixture
def v1_project(tmp_path, monkeypatch):
    """A project for SDK v1 (its HOME under tmp_path), without the space.yaml of `project`."""
    return make_project(tmp_path, monkeypatch, v1=True)


@pytest.mark.parametrize(("text", "expected"), [
    ("user", JobIdentity("user")),
    ("managed", JobIdentity("managed")),
    (f"managed:{CLIENT_ID.upper()}", JobIdentity("managed", CLIENT_ID)),
])
def test_identities_parse(text, expected):
    assert parse_identity(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("admin", "--identity 'admin': expected user, managed or managed:CLIENT_ID"),
    ("user:x", "--identity 'user:x': expected user, managed or managed:CLIENT_ID"),
    ("managed:my-identity", "--identity 'managed:my-identity': the client id of a user-assigned managed "
                            "identity is a GUID (az identity show --query clientId)"),
])
def test_other_identities_are_one_line(project, text, message):
    with pytest.raises(JobSpecError) as error:
        resolve(spec(identity=text))

    assert str(error.value) == message


# --- SDK v2 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "written", "sent"), [
    ("user", {"type": "user_identity"}, {"identityType": "UserIdentity"}),
    ("managed", {"type": "managed_identity"}, {"identityType": "Managed"}),
    (f"managed:{CLIENT_ID}", {"type": "managed_identity", "client_id": CLIENT_ID},
     {"identityType": "Managed", "clientId": CLIENT_ID}),
])
def test_v2_dry_run_writes_the_identity_and_validates_it_in_the_rest_body(project, tmp_path, text, written,
                                                                          sent):
    result = submission.dry_run(spec(identity=text), tmp_path / "job.yml")

    assert yaml.safe_load((tmp_path / "job.yml").read_text())["identity"] == written
    assert result.body["identity"] == sent
    assert any(line.startswith("identity: ") for line in result.report())


def test_a_user_assigned_identity_is_also_the_jobs_azure_client_id(project, tmp_path):
    result = submission.dry_run(spec(identity=f"managed:{CLIENT_ID}"), tmp_path / "job.yml")

    assert result.body["environmentVariables"]["AZURE_CLIENT_ID"] == CLIENT_ID
    assert (f"identity: managed (user-assigned, client id {CLIENT_ID}), also DefaultAzureCredential's in the "
            "job") in result.report()
    assert "AZURE_CLIENT_ID" not in resolve(spec(identity="managed")).env


def test_a_different_azure_client_id_in_env_is_refused(project):
    with pytest.raises(JobSpecError, match=r"^--env AZURE_CLIENT_ID=99999999-2222-3333-4444-555555555555 and "
                                           r"--identity managed:1111.* name different identities"):
        resolve(spec(identity=f"managed:{CLIENT_ID}", env={"AZURE_CLIENT_ID": "99999999-2222-3333-4444-"
                                                                               "555555555555"}))


def test_without_identity_the_job_has_azure_mls_default(project, tmp_path):
    result = submission.dry_run(spec(), tmp_path / "job.yml")

    assert "identity" not in yaml.safe_load((tmp_path / "job.yml").read_text())
    assert result.body.get("identity") is None


def test_a_sweep_job_runs_as_the_identity(project, tmp_path):
    result = submission.dry_run(spec(identity="user", sweep=sweep(space="space.yaml")), tmp_path / "s.yml")

    assert yaml.safe_load((tmp_path / "s.yml").read_text())["identity"] == {"type": "user_identity"}
    assert result.body["identity"] == {"identityType": "UserIdentity"}


def test_v2_submission_puts_the_job_with_its_identity(project, fake):
    submit(fake, identity=f"managed:{CLIENT_ID}")

    body = fake.job_put()
    assert body["identity"] == {"identityType": "Managed", "clientId": CLIENT_ID}
    assert body["environmentVariables"]["AZURE_CLIENT_ID"] == CLIENT_ID


@pytest.mark.parametrize("variant", [[], ["sweep", "--space", "space.yaml", "--metric", "eval_loss"]])
def test_cli_takes_identity_for_submit_and_sweep_and_prints_it(project, capsys, variant):
    code = main(["submit", *variant, "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE,
                 "--dry-run", "--json", "--identity", f"managed:{CLIENT_ID}"])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["identity"] == {"type": "managed", "client_id": CLIENT_ID}


# --- SDK v1 -----------------------------------------------------------------------------------------------
def test_v1_user_identity_is_credential_passthrough(v1_project, service):
    submit_v1(identity="user")

    assert service.snapshot_run()["Configuration"]["credentialPassthrough"] is True


def test_v1_dry_run_writes_credential_passthrough(project, tmp_path):
    submission.dry_run(spec(identity="user"), tmp_path / "run.yml", sdk="v1")

    assert yaml.safe_load((tmp_path / "run.yml").read_text())["credentialPassthrough"] is True


@pytest.mark.parametrize("text", ["managed", f"managed:{CLIENT_ID}"])
def test_v1_refuses_a_managed_identity_in_one_line_before_any_request(v1_project, service, text):
    with pytest.raises(JobSpecError) as error:
        submit_v1(identity=text)

    assert str(error.value) == ("--identity managed needs SDK v2 (the default): azureml-core's run "
                                "configuration has no managed identity, only credential passthrough "
                                "(--identity user)")
    assert service.calls == []


# --- inside the job -----------------------------------------------------------------------------------------
def test_inside_the_job_default_azure_credential_asks_azure_ml_for_the_user_assigned_identity(monkeypatch):
    """What adlfs does for abfs:// without a key (DefaultAzureCredential), in the environment an Azure ML job
    with --identity managed:CLIENT_ID has: Azure ML's MSI endpoint, and AZURE_CLIENT_ID from the job."""
    from azure.identity import DefaultAzureCredential

    for name in ("AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT",
                 "IMDS_ENDPOINT", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_USERNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MSI_ENDPOINT", "http://127.0.0.1:46808/MSI/auth")
    monkeypatch.setenv("MSI_SECRET", "fake-msi-secret")
    monkeypatch.setenv("AZURE_CLIENT_ID", CLIENT_ID)
    asked: list[requests.PreparedRequest] = []

    def token(request):
        asked.append(request)
        return 200, {}, json.dumps({"access_token": "fake-storage-token", "expires_on": "9999999999",
                                    "resource": "https://storage.azure.com", "token_type": "Bearer"})

    with responses.RequestsMock() as endpoint:
        endpoint.add_callback("GET", re.compile(r"http://127\.0\.0\.1:46808/MSI/auth.*"), callback=token)
        DefaultAzureCredential().get_token("https://storage.azure.com/.default")

    (request,) = asked
    assert f"clientid={CLIENT_ID}" in request.url
    assert request.headers["secret"] == "fake-msi-secret"


def test_a_v1_in_job_sweep_runs_with_credential_passthrough(v1_project, service):
    """An in-job sweep is one ScriptRunConfig run (the sweep runs inside it), which credential passthrough
    covers as it covers a command job."""
    from hvdazure.azure.spec.sweep import InJobSweepSpec

    (v1_project / "space.yaml").write_text("lr: {type: choice, values: [0.1, 0.01]}\n")
    submit_v1(identity="user", sweep=InJobSweepSpec("space.yaml", "eval_loss", ranks_per_trial=4))

    configuration = service.snapshot_run()["Configuration"]
    assert configuration["credentialPassthrough"] is True
    assert configuration["command"].startswith("python -m hvdazure.sweep train.py")


def test_v1_refuses_an_identity_for_a_hyperdrive_sweep(project):
    with pytest.raises(JobSpecError, match=r"^--identity with --sdk v1 is not for a HyperDrive") as error:
        submission.dry_run(spec(identity="user", sweep=sweep(space="space.yaml")), "run.yml", sdk="v1")
    assert str(error.value).endswith("use SDK v2 (the default), or `hvdazure submit in-job-sweep`")
