"""`--input`, parsed as strictly as Azure ML reads it: what azure-ai-ml 1.35.2 would turn into a wrong path
or refuse only after the upload is one line naming the value, offline. And in a real submission every
`azureml:` data asset is looked up in the workspace before the environment is registered or the code
uploaded (the fake workspace of test_azure_submit_v2.py records every request, blob uploads included)."""

from __future__ import annotations

import pytest
from test_azure_submit_v2 import (  # noqa: F401  (fixtures)
    IMAGE,
    WORKSPACE,
    FakeCredential,
    FakeWorkspace,
    RecordingTransport,
    fake,
    project,
    submit,
)

from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.job_spec import InputSpec, JobSpec, parse_input, resolve
from hvdazure.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize(("text", "expected"), [
    ("data=azureml:digits@latest", InputSpec("data", "azureml:digits@latest")),
    ("data=azureml:digits:3", InputSpec("data", "azureml:digits:3")),
    ("data=azureml:digits:prod", InputSpec("data", "azureml:digits:prod")),  # a version may be any word
    ("data=azureml:digits.v2:2024.01.01", InputSpec("data", "azureml:digits.v2:2024.01.01")),
    ("data=azureml:digits:3:download", InputSpec("data", "azureml:digits:3", mode="download")),
    ("data=azureml:digits@latest:direct", InputSpec("data", "azureml:digits@latest", mode="direct")),
    ("w=uri_file:azureml:weights:1", InputSpec("w", "azureml:weights:1", type="uri_file")),
    ("d=azureml://datastores/workspaceblobstore/paths/digits/",
     InputSpec("d", "azureml://datastores/workspaceblobstore/paths/digits/")),
    ("d=azureml://datastores/ws/paths/digits/:download",
     InputSpec("d", "azureml://datastores/ws/paths/digits/", mode="download")),
    ("d=azureml://subscriptions/s/resourcegroups/rg/workspaces/ws/datastores/blob/paths/x/",
     InputSpec("d", "azureml://subscriptions/s/resourcegroups/rg/workspaces/ws/datastores/blob/paths/x/")),
    ("d=azureml://subscriptions/s/resourceGroups/rg/workspaces/ws/data/digits/versions/3",
     InputSpec("d", "azureml://subscriptions/s/resourceGroups/rg/workspaces/ws/data/digits/versions/3")),
    ("d=azureml://registries/shared/data/digits/versions/3",
     InputSpec("d", "azureml://registries/shared/data/digits/versions/3")),
    ("d=azureml://jobs/job-1/outputs/model/paths/",
     InputSpec("d", "azureml://jobs/job-1/outputs/model/paths/")),
    ("raw=https://acct.blob.core.windows.net/c/d/", InputSpec("raw", "https://acct.blob.core.windows.net/c/d/")),
    ("raw=abfss://fs@acct.dfs.core.windows.net/d:download",
     InputSpec("raw", "abfss://fs@acct.dfs.core.windows.net/d", mode="download")),
    ("raw=wasbs://c@acct.blob.core.windows.net/d/", InputSpec("raw", "wasbs://c@acct.blob.core.windows.net/d/")),
    ("raw=https://host:8443/d/", InputSpec("raw", "https://host:8443/d/")),
    ("local=data/train:download", InputSpec("local", "data/train", mode="download")),
])
def test_the_forms_azure_ml_reads_parse(text, expected):
    assert parse_input(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("data=azureml:digits", "--input data: azureml:digits has no version (Azure ML requires one): give "
                            "azureml:digits:VERSION or azureml:digits@latest"),
    ("data=azureml:digits:download", "--input data: azureml:digits has no version"),
    ("data=azureml:digits@prod", "--input data: label 'prod' in azureml:digits@prod: azure-ai-ml resolves "
                                 "only @latest; give the version, azureml:digits:VERSION"),
    ("data=azureml:digits:latest", "--input data: azureml:digits:latest names version 'latest'; the latest "
                                   "version is azureml:digits@latest"),
    ("data=azureml:digits@latest:ro-mount", "--input data: mode 'ro-mount' is not one of ro_mount, download, "
                                            "direct for a uri_folder input"),
    ("data=azureml:digits:3:readonly", "--input data: mode 'readonly' is not one of ro_mount"),
    ("data=azureml:digits@latest:eval_mount", "--input data: mode 'eval_mount' is not one of ro_mount, "
                                              "download, direct for a uri_folder input (eval_mount is for "
                                              "mltable inputs)"),
    ("data=azureml:digits@latest:rw_mount", "--input data: mode 'rw_mount' is not one of ro_mount, download, "
                                            "direct for a uri_folder input (rw_mount is for outputs)"),
    ("data=mltable:azureml:digits@latest", "--input data: type 'mltable' is not one of uri_folder, uri_file"),
    ("data=urifolder:azureml:digits@latest", "--input data: type 'urifolder' is not one of uri_folder"),
    ("data=azureml:digits:3:4", "--input data: 'azureml:digits:3:4' is not a data asset reference"),
    ("data=azureml:dig its@latest", "--input data: 'azureml:dig its@latest' is not a data asset reference"),
    ("d=azureml://datastore/ws/paths/x", "--input d: azureml://datastore/ws/paths/x is not a datastore path"),
    ("d=azureml://datastores/ws/digits/", "--input d: azureml://datastores/ws/digits/ is not a datastore"),
    ("d=s3://bucket/digits/", "--input d: scheme 's3' is not one Azure ML reads (azureml, https"),
    ("d=data:ro-mount", "--input d: mode 'ro-mount' is not one of ro_mount"),
    ("d=digits@latest", None),  # a local path that happens to hold an '@': fine if it exists (resolve)
])
def test_what_azure_ml_would_misread_or_refuse_late_is_one_line_naming_it(text, message):
    if message is None:
        assert parse_input(text).uri == "digits@latest"
        return
    with pytest.raises(JobSpecError) as error:
        parse_input(text)

    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_an_input_built_in_python_is_checked_as_strictly(project):  # noqa: F811
    job = JobSpec(script="train.py", compute="c", processes_per_node=1, image=IMAGE,
                  inputs=[InputSpec("data", "azureml:digits", mode="download")])
    with pytest.raises(JobSpecError, match=r"^--input data: azureml:digits has no version"):
        resolve(job)


@pytest.mark.parametrize("value", ["azureml:digits", "azureml:digits@prod", "azureml:digits@latest:ro-mount",
                                   "mltable:azureml:digits@latest", "azureml:digits@latest:eval_mount"])
def test_the_dry_run_refuses_each_in_one_line_naming_it(project, capsys, value):  # noqa: F811
    code = main(["submit", "train.py", "--compute", "gpu-cluster", "--nodes", "2", "--vm-size",
                 "Standard_ND96asr_v4", "--image", IMAGE, "--dry-run", "--input", f"data={value}", "--",
                 "--set", "extra.data=${{inputs.data}}"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hvdazure: error: --input data: ")
    assert err.count("\n") == 1
    assert not (project / "hvdazure-job.yml").exists()


# --- a real submission: each data asset looked up before anything is uploaded -----------------------------
def _uploads_or_registrations(fake: FakeWorkspace) -> list[str]:  # noqa: F811
    return [p for m, p, _ in fake.calls if p.startswith(("blob:", "/codes/")) or
            (m == "PUT" and "/environments/" in p)]


@pytest.mark.parametrize(("value", "message"), [
    ("azureml:faces@latest", "--input data: data asset azureml:faces@latest not found in the workspace"),
    ("azureml:digits:7", "--input data: data asset azureml:digits:7 not found in the workspace"),
])
def test_a_missing_data_asset_stops_the_submission_before_any_upload(project, fake, value, message):  # noqa: F811
    with pytest.raises(SubmitError) as error:
        submit(fake, inputs=[InputSpec("data", value)], script_args=["--set", "extra.data=${{inputs.data}}"])

    assert str(error.value) == message
    assert _uploads_or_registrations(fake) == []
    assert not [p for _, p, _ in fake.calls if p.startswith("/jobs/")]


def test_data_assets_are_looked_up_before_the_environment_and_the_code(project, fake):  # noqa: F811
    submit(fake, inputs=[InputSpec("data", "azureml:digits@latest"), InputSpec("pinned", "azureml:digits:3")],
           script_args=["--set", "extra.data=${{inputs.data}}", "--set", "extra.pinned=${{inputs.pinned}}"])

    paths = [p for _, p, _ in fake.calls]
    first_upload = min(paths.index(p) for p in _uploads_or_registrations(fake))
    # @latest: the asset's latest version, then that version, as the SDK's own label resolver reads them
    assert paths.index("/data/digits") < paths.index("/data/digits/versions/3") < first_upload
    assert fake.job_put()["inputs"]["data"]["uri"].endswith("/data/digits/versions/3")


def test_the_dry_run_says_which_references_the_submission_looks_up_first(project, tmp_path):  # noqa: F811
    from hvdazure.azure import submission

    job = JobSpec(script="train.py", compute="c", processes_per_node=1, environment="azureml:team@latest",
                  inputs=[InputSpec("data", "azureml:digits@latest"), InputSpec("raw", "https://a.b/c/")],
                  script_args=["--set", "extra.data=${{inputs.data}}", "--set", "extra.raw=${{inputs.raw}}"])
    report = submission.dry_run(job, tmp_path / "job.yml").report()

    assert ("looked up in the workspace when submitting, before any upload: data (azureml:digits@latest), "
            "environment azureml:team@latest") in report


@pytest.mark.parametrize(("overrides", "message"), [
    ({"inputs": [InputSpec("data", "azureml:faces@latest")],
      "script_args": ["--set", "extra.data=${{inputs.data}}"]},
     "--input data: data asset azureml:faces@latest not found in the workspace"),
    ({"image": None, "environment": "azureml:team-env:4"},
     "environment azureml:team-env:4 not found in the workspace"),
])
def test_a_missing_reference_stops_the_submission_before_a_cluster_is_created(project, fake, overrides,  # noqa: F811
                                                                               message):
    from hvdazure.azure import submission
    from hvdazure.azure.compute import ClusterSpec

    spec = JobSpec(**{"script": "train.py", "compute": "nc-cluster", "nodes": 2, "image": IMAGE, **overrides})
    with pytest.raises(SubmitError) as error:
        submission.submit(spec, WORKSPACE, credential=FakeCredential(),
                          create_compute=ClusterSpec("nc-cluster", "Standard_NC48ads_A100_v4", max_nodes=2),
                          client_options={"transport": RecordingTransport(fake)})

    assert str(error.value) == message
    assert not [p for _, p, _ in fake.calls if p.startswith("/computes/")]
    assert _uploads_or_registrations(fake) == []
