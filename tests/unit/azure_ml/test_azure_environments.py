"""The job's environment as each SDK sends it, offline: what the dry run prints and writes is what the
submission sends (SDK v1 included), and registry environments (`azureml://registries/...`, the form of
Azure ML's curated ones) are referenced by SDK v2 as they are and refused by SDK v1 in one line. The fake
services of sdk_v2_fakes.py and sdk_v1_fakes.py record every request."""

from __future__ import annotations

import re
from functools import partial

import job_specs
import pytest
import yaml
from job_specs import IMAGE, submit_v1
from sdk_v1_fakes import FakeService, serving
from sdk_v2_fakes import submit

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import resolve
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
TEAM_IMAGE = "myacr.azurecr.io/team:7"
REGISTRY_LATEST = "azureml://registries/azureml/environments/acpt-pytorch-2.2-cuda12.1/labels/latest"
REGISTRY_VERSION = "azureml://registries/azureml/environments/acpt-pytorch-2.2-cuda12.1/versions/12"


pytestmark.append(pytest.mark.project(v1=True))
spec = partial(job_specs.spec, processes_per_node=8)


# --- SDK v1: the dry run prints and writes what the submission sends ------------------------------------
def test_v1_dry_run_writes_the_environment_version_it_prints(project, tmp_path):
    result = submission.dry_run(spec(), tmp_path / "run.yml", sdk="v1")

    version = result.job.environment.version
    written = yaml.safe_load((tmp_path / "run.yml").read_text())["environment"]
    assert re.fullmatch(r"0\.1\.0-[0-9a-f]{12}", version)
    assert (written["name"], written["version"]) == ("hvdazure-gpu", version)
    assert f"environment: azureml:hvdazure-gpu:{version} (image {IMAGE})" in result.report()


def test_v1_dry_run_names_a_registered_environment_instead_of_the_sdks_placeholder(project, tmp_path):
    result = submission.dry_run(spec(image=None, environment="azureml:team@latest"), tmp_path / "run.yml",
                                sdk="v1")

    text = (tmp_path / "run.yml").read_text()
    assert yaml.safe_load(text)["environment"] == {"name": "team", "version": None}
    for placeholder in ("EXAMPLE_ENV_VAR", "python=3.8", "azureml-defaults"):
        assert placeholder not in text
    assert ("environment team: the submission sends the workspace's definition of its latest version "
            "(azureml-core's Environment.get); the run configuration written here names it only"
            in result.report())


class EnvironmentService(FakeService):
    """FakeService with the workspace's environments (azureml-core's environment service)."""

    def __init__(self) -> None:
        super().__init__()
        self.environments = {"team": {"2": {"name": "team", "version": "2", "environmentVariables": {},
                                            "python": {"userManagedDependencies": True,
                                                       "interpreterPath": "python"},
                                            "docker": {"baseImage": TEAM_IMAGE}}}}

    def _answer(self, method, url, request):
        if match := re.search(r"/environment/v1\.0/.*/environments/([^/]+)(?:/versions/([^/]+))?$", url):
            versions = self.environments.get(match.group(1), {})
            version = match.group(2) or (max(versions) if versions else None)
            if version in versions:
                return 200, versions[version]
            return 404, {"error": {"code": "NotFound", "message": "environment not found"}}
        return super()._answer(method, url, request)


@pytest.fixture
def service():
    fake_service = EnvironmentService()
    with serving(fake_service):
        yield fake_service


def test_v1_submission_sends_the_environment_version_the_dry_run_printed(project, service):
    submit_v1()

    sent = service.snapshot_run()["Configuration"]["environment"]
    assert (sent["name"], sent["version"]) == ("hvdazure-gpu", resolve(spec()).environment.version)


def test_v1_submission_sends_the_workspaces_latest_registered_environment(project, service):
    submit_v1(image=None, environment="azureml:team@latest")

    sent = service.snapshot_run()["Configuration"]["environment"]
    assert (sent["name"], sent["version"], sent["docker"]["baseImage"]) == ("team", "2", TEAM_IMAGE)
    assert "EXAMPLE_ENV_VAR" not in str(sent)


def test_v1_a_missing_registered_environment_is_one_line_before_the_snapshot(project, service):
    with pytest.raises(SubmitError) as error:
        submit_v1(image=None, environment="azureml:team:7")

    assert str(error.value) == "environment azureml:team:7 not found in the workspace"
    assert not [u for m, u, _ in service.calls if "snapshot" in u or "blob.core" in u]


# --- registry environments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("reference", [REGISTRY_LATEST, REGISTRY_VERSION])
def test_v2_references_a_registry_environment_as_azure_ml_writes_it(project, tmp_path, reference):
    result = submission.dry_run(spec(image=None, environment=reference), tmp_path / "job.yml")

    assert [f.name for f in result.files] == ["job.yml"]  # nothing to register
    assert yaml.safe_load((tmp_path / "job.yml").read_text())["environment"] == reference
    assert result.body["environmentId"] == reference
    assert f"environment: {reference}" in result.report()


def test_v2_submits_a_registry_environment_without_looking_in_the_workspace(project, fake):
    submit(fake, image=None, environment=REGISTRY_LATEST)

    assert not [p for _, p, _ in fake.calls if "/environments/" in p]
    assert fake.job_put()["environmentId"] == REGISTRY_LATEST


def test_v1_refuses_a_registry_environment_in_one_line_before_any_request(project, service):
    with pytest.raises(JobSpecError) as error:
        submit_v1(image=None, environment=REGISTRY_LATEST)

    assert str(error.value) == (f"--environment {REGISTRY_LATEST}: SDK v1 cannot use registry environments "
                                "(azureml-core's Environment.get reads the workspace only); use --sdk v2, or "
                                "an environment of the workspace, azureml:NAME@latest")
    assert service.calls == []


@pytest.mark.parametrize(("reference", "message"), [
    ("azureml://registries/azureml/environments/acpt/labels/prod",
     "label 'prod': a registry environment is named by labels/latest or versions/VERSION"),
    ("azureml://registries/azureml/environments/acpt", "expected azureml://registries/REGISTRY/environments/"),
    ("azureml://registries/azureml/models/acpt/versions/1", "expected azureml://registries/REGISTRY/"),
])
def test_a_malformed_registry_environment_is_refused(project, reference, message):
    with pytest.raises(JobSpecError) as error:
        resolve(spec(image=None, environment=reference))

    assert message in str(error.value)


def test_cli_dry_run_v1_with_a_registry_environment_is_one_line(project, capsys):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--environment", REGISTRY_VERSION,
                 "--dry-run", "--sdk", "v1"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"hvdazure: error: --environment {REGISTRY_VERSION}: SDK v1 cannot use registry")
    assert err.count("\n") == 1
