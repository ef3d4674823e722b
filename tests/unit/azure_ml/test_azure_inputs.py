"""`--input` and `--output`, parsed as strictly as Azure ML reads them: what azure-ai-ml 1.35.2 would turn
into a wrong path or refuse only after the upload is one line naming the value, offline. In a real submission
every `azureml:` data asset is looked up in the workspace before the environment is registered or the code
uploaded, a URL goes through unchanged and a local path is uploaded, for every kind of job (the fake
workspace of sdk_v2_fakes.py records every request, blob uploads included)."""

from __future__ import annotations

import pytest
import yaml
from sdk_v2_fakes import (
    IMAGE,
    PROJECT,
    WORKSPACE,
    FakeCredential,
    FakeWorkspace,
    RecordingTransport,
    submit,
)

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import InputSpec, JobSpec, OutputSpec, parse_input, parse_output, resolve
from hvdazure.azure.spec.sweep import InJobSweepSpec, SweepSpec
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), PROJECT]


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


def test_an_input_built_in_python_is_checked_as_strictly(project):
    job = JobSpec(script="train.py", compute="cpu", processes_per_node=1, image=IMAGE,
                  inputs=[InputSpec("data", "azureml:digits", mode="download")])
    with pytest.raises(JobSpecError, match=r"^--input data: azureml:digits has no version"):
        resolve(job)


@pytest.mark.parametrize("value", ["azureml:digits", "azureml:digits@prod", "azureml:digits@latest:ro-mount",
                                   "mltable:azureml:digits@latest", "azureml:digits@latest:eval_mount"])
def test_the_dry_run_refuses_each_in_one_line_naming_it(project, capsys, value):
    code = main(["submit", "train.py", "--compute", "gpu-cluster", "--nodes", "2", "--vm-size",
                 "Standard_ND96asr_v4", "--image", IMAGE, "--dry-run", "--input", f"data={value}", "--",
                 "--set", "extra.data=${{inputs.data}}"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hvdazure: error: --input data: ")
    assert err.count("\n") == 1
    assert not (project / "hvdazure-job.yml").exists()


# --- a real submission: each data asset looked up before anything is uploaded -----------------------------
def _uploads_or_registrations(fake: FakeWorkspace) -> list[str]:
    return [p for m, p, _ in fake.calls if p.startswith(("blob:", "/codes/")) or
            (m == "PUT" and "/environments/" in p)]


@pytest.mark.parametrize(("value", "message"), [
    ("azureml:faces@latest", "--input data: data asset azureml:faces@latest not found in the workspace"),
    ("azureml:digits:7", "--input data: data asset azureml:digits:7 not found in the workspace"),
])
def test_a_missing_data_asset_stops_the_submission_before_any_upload(project, fake, value, message):
    with pytest.raises(SubmitError) as error:
        submit(fake, inputs=[InputSpec("data", value)], script_args=["--set", "extra.data=${{inputs.data}}"])

    assert str(error.value) == message
    assert _uploads_or_registrations(fake) == []
    assert not [p for _, p, _ in fake.calls if p.startswith("/jobs/")]


def test_data_assets_are_looked_up_before_the_environment_and_the_code(project, fake):
    submit(fake, inputs=[InputSpec("data", "azureml:digits@latest"), InputSpec("pinned", "azureml:digits:3")],
           script_args=["--set", "extra.data=${{inputs.data}}", "--set", "extra.pinned=${{inputs.pinned}}"])

    paths = [p for _, p, _ in fake.calls]
    first_upload = min(paths.index(p) for p in _uploads_or_registrations(fake))
    # @latest: the asset's latest version, then that version, as the SDK's own label resolver reads them
    assert paths.index("/data/digits") < paths.index("/data/digits/versions/3") < first_upload
    assert fake.job_put()["inputs"]["data"]["uri"].endswith("/data/digits/versions/3")


def test_the_dry_run_says_which_references_the_submission_looks_up_first(project, tmp_path):
    from hvdazure.azure import submission

    job = JobSpec(script="train.py", compute="cpu", processes_per_node=1, environment="azureml:team@latest",
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
def test_a_missing_reference_stops_the_submission_before_a_cluster_is_created(project, fake, overrides,
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


# --- how the submission resolves each input: URLs as they are, local paths uploaded -----------------------
URL = "https://acct2.blob.core.windows.net/c/raw/"
KINDS = {"command job": None, "sweep job": SweepSpec("space.yaml", "eval_loss"),
         "in-job sweep": InJobSweepSpec("space.yaml", "eval_loss")}
ARGS = ["--set", "extra.raw=${{inputs.raw}}", "--set", "extra.local=${{inputs.local}}"]


@pytest.fixture
def local_data(project):
    """A folder outside the code directory, so its upload is its own, not the code's."""
    (project / "space.yaml").write_text("lr: {type: choice, values: [0.1, 0.01]}\n")
    folder = project.parent / "localdata"
    folder.mkdir()
    (folder / "part-0.bin").write_bytes(b"x" * 10)
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_a_submission_passes_a_url_through_and_uploads_a_local_folder(project, fake, local_data, kind):
    submit(fake, inputs=[InputSpec("raw", URL), InputSpec("local", "../localdata")], script_args=ARGS,
           sweep=KINDS[kind])

    inputs = fake.job_put()["inputs"]
    assert inputs["raw"]["uri"] == URL  # unchanged: no data asset lookup
    assert not [p for _, p, _ in fake.calls if p.startswith("/data/")]
    # the folder goes to the default datastore, and the job reads it from there
    uploaded = [p for m, p, _ in fake.calls if m == "PUT" and p.startswith("blob:https://")]
    assert uploaded and all(p.endswith("/localdata/part-0.bin") for p in uploaded)
    assert ("GET", "/datastores/workspaceblobstore") in fake.arm_calls()
    assert inputs["local"]["uri"].startswith("azureml://datastores/workspaceblobstore/paths/LocalUpload/")
    assert inputs["local"]["uri"].endswith("/localdata/")


@pytest.mark.parametrize("kind", KINDS)
def test_the_dry_run_writes_a_url_as_it_is_and_a_local_path_as_an_absolute_path(project, local_data,
                                                                                  tmp_path, kind):
    from azure.ai.ml import load_job

    result = submission.dry_run(JobSpec(script="train.py", compute="cpu", processes_per_node=1, image=IMAGE,
                                        inputs=[InputSpec("raw", URL), InputSpec("local", "../localdata")],
                                        script_args=ARGS, sweep=KINDS[kind]), tmp_path / "out" / "job.yml")

    written = yaml.safe_load((tmp_path / "out" / "job.yml").read_text())["inputs"]
    assert (written["raw"]["path"], written["local"]["path"]) == (URL, str(local_data))
    loaded = load_job(tmp_path / "out" / "job.yml").inputs
    assert (loaded["raw"].path, loaded["local"].path) == (URL, str(local_data))
    assert f"input local: uri_folder {local_data} (ro_mount, uploaded when submitting)" in result.report()
    assert f"input raw: uri_folder {URL} (ro_mount)" in result.report()
    assert result.check.checked.endswith(", and each input as azure-ai-ml resolves it when submitting (raw "
                                         "passed through, local uploaded)")


def test_the_dry_run_refuses_a_job_file_whose_inputs_the_submission_would_look_up_as_assets(project,
                                                                                             local_data,
                                                                                             tmp_path):
    """What azure-ai-ml's own dump writes (`azureml:` before every path) is caught by the offline check."""
    from hvdazure.azure.v2.submit import V2Sdk

    job = resolve(JobSpec(script="train.py", compute="cpu", processes_per_node=1, image=IMAGE,
                          inputs=[InputSpec("raw", URL)], script_args=ARGS[:2]))
    files = V2Sdk().write_yaml(job, tmp_path / "job.yml")
    files[-1].write_text(files[-1].read_text().replace(f"path: {URL}", f"path: azureml:{URL}"))

    with pytest.raises(SubmitError) as error:
        V2Sdk().validate_offline(job, files)
    assert str(error.value) == (f"job.yml: input raw loads back as 'azureml:{URL}', which azure-ai-ml would "
                                f"have looked up as a data asset when submitting; {URL} is to be passed "
                                "through")


@pytest.mark.parametrize(("value", "message"), [
    ("uri_file:../localdata", "--input local: ../localdata is a directory, and a uri_file input a file"),
    ("../localdata/part-0.bin", "--input local: ../localdata/part-0.bin is a file, and a uri_folder input a "
                                "directory: give --input local=uri_file:../localdata/part-0.bin"),
    ("../nothing", "--input local: ../nothing does not exist (a local path is uploaded)"),
])
def test_a_local_input_of_the_wrong_kind_is_refused_before_anything_is_written(project, local_data, capsys,
                                                                               value, message):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 "--output-yaml", "../job.yml", "--input", f"local={value}", "--", "--set",
                 "extra.local=${{inputs.local}}"])

    assert code == 2
    assert capsys.readouterr().err == f"hvdazure: error: {message}\n"
    assert not (project.parent / "job.yml").exists()


@pytest.mark.parametrize("value", [URL, "../localdata"])
def test_sdk_v1_refuses_a_url_or_local_input_in_one_line(project, local_data, capsys, value):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 "--sdk", "v1", "--output-yaml", "../job.yml", "--input", f"data={value}", "--", "--set",
                 "extra.data=${{inputs.data}}"])

    assert code == 2
    assert capsys.readouterr().err == ("hvdazure: error: --input and --output need SDK v2 (the default); "
                                       "with --sdk v1, pass the script a datastore path instead\n")


# --- outputs: where Azure ML writes them ------------------------------------------------------------------
DATASTORE = "azureml://datastores/workspaceblobstore/paths/runs/x/"


@pytest.mark.parametrize(("text", "expected"), [
    ("ckpt", OutputSpec("ckpt")),
    ("ckpt:upload", OutputSpec("ckpt", mode="upload")),
    ("ckpt:mount", OutputSpec("ckpt")),  # azure-ai-ml's other name for rw_mount
    (f"ckpt={DATASTORE}", OutputSpec("ckpt", DATASTORE)),
    (f"ckpt={DATASTORE}:upload", OutputSpec("ckpt", DATASTORE, mode="upload")),
    ("m=uri_file:azureml://datastores/ws/paths/m.pt", OutputSpec("m", "azureml://datastores/ws/paths/m.pt",
                                                               type="uri_file")),
    ("m=azureml://subscriptions/s/resourcegroups/rg/workspaces/ws/datastores/blob/paths/x/:direct",
     OutputSpec("m", "azureml://subscriptions/s/resourcegroups/rg/workspaces/ws/datastores/blob/paths/x/",
                mode="direct")),
    # the model types, in Azure ML's default place or a datastore path
    ("model=mlflow_model", OutputSpec("model", type="mlflow_model")),
    ("model=custom_model:upload", OutputSpec("model", type="custom_model", mode="upload")),
    (f"model=custom_model:{DATASTORE}:upload", OutputSpec("model", DATASTORE, "custom_model", "upload")),
    # registered as an asset when the job ends: name=, and version= (else the asset's next version)
    ("model=mlflow_model,name=digits-model,version=3",
     OutputSpec("model", type="mlflow_model", asset_name="digits-model", asset_version="3")),
    ("ckpt:upload,name=digits.ckpt", OutputSpec("ckpt", mode="upload", asset_name="digits.ckpt")),
    ("ckpt,version=2,name=digits_ckpt", OutputSpec("ckpt", asset_name="digits_ckpt", asset_version="2")),
    (f"ckpt={DATASTORE},name=ckpts", OutputSpec("ckpt", DATASTORE, asset_name="ckpts")),
])
def test_the_outputs_azure_ml_writes_parse(text, expected):
    assert parse_output(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("m=s3://bucket/x", "--output m: s3://bucket/x is not a datastore path: Azure ML writes outputs to a "
                        "datastore path, azureml://datastores/NAME/paths/PATH, or, without a URI, to its "
                        "default datastore"),
    ("m=/local/dir", "--output m: /local/dir is a local path, which a job cannot write to: Azure ML writes"),
    ("m=out/dir", "--output m: out/dir is a local path, which a job cannot write to"),
    ("ckpt=azureml:mymodel:1", "--output ckpt: azureml:mymodel:1 names a data asset, which a job does not "
                               "write to: Azure ML writes outputs to a datastore path"),
    ("m=https://acct.blob.core.windows.net/c/x/", "--output m: https://acct.blob.core.windows.net/c/x/ is a "
                                                  "storage URL, not a datastore path (register the storage "
                                                  "account as a datastore)"),
    ("m=azureml://jobs/j/outputs/o/paths/x", "--output m: azureml://jobs/j/outputs/o/paths/x is not a "
                                             "datastore path"),
    (f"m={DATASTORE}:ro_mount", "--output m: mode 'ro_mount' is not one of rw_mount, upload, direct for an "
                                "output (ro_mount is for inputs)"),
    (f"m={DATASTORE}:rw-mount", "--output m: mode 'rw-mount' is not one of rw_mount, upload, direct"),
    ("ckpt:download", "--output ckpt: mode 'download' is not one of rw_mount, upload, direct for an output "
                      "(download is for inputs)"),
    ("ckpt:", "--output 'ckpt:': no mode after ':' (one of rw_mount, upload, direct)"),
    ("m=mltable:azureml://datastores/ws/paths/m/", "--output m: type 'mltable' is not one of "
                                                   "uri_folder, uri_file, mlflow_model, custom_model"),
    ("m=triton_model", "--output m: type 'triton_model' is not one of uri_folder, uri_file, mlflow_model, "
                       "custom_model"),
    ("m=uri_file", "--output m: a uri_file output is one file: give its datastore path, "
                   "m=uri_file:azureml://datastores/NAME/paths/PATH"),
    ("m=", "--output m: nothing after '=': give NAME, NAME:MODE, NAME=TYPE or "
           "NAME=azureml://datastores/NAME/paths/PATH"),
    ("1m", "--output name '1m': letters, digits and '_'"),
    ("m=mlflow_model,version=3", "--output m: version=3 goes with name=ASSET, the asset the output is "
                                 "registered as"),
    ("m=mlflow_model,name=-model", "--output m: name='-model': 1 to 255 letters, digits, '-', '_' and '.', "
                                   "not starting with '-', '_' or '.' nor ending with '.' (Azure ML's asset "
                                   "names)"),
    ("m=mlflow_model,name=model.", "--output m: name='model.': 1 to 255"),
    ("m=mlflow_model,name=my model", "--output m: name='my model': 1 to 255"),
    (f"m=mlflow_model,name={'m' * 256}", "--output m: name='mmm"),
    ("m=mlflow_model,name=model,version=latest",
     "--output m: version='latest': letters, digits, '_', '.' and '-', not 'latest' (without version=, Azure "
     "ML registers the asset's next version)"),
    ("m=mlflow_model,name=model,version=", "--output m: version='': letters, digits"),
    ("m=mlflow_model,nmae=model", "--output m: unknown setting nmae= (name=ASSET and version=VERSION "
                                  "register the output)"),
    ("m,name=a,name=b", "--output m: name= is given twice"),
])
def test_an_output_azure_ml_would_not_write_where_asked_is_one_line_naming_it(text, message):
    with pytest.raises(JobSpecError) as error:
        parse_output(text)

    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_an_output_built_in_python_is_checked_as_strictly(project):
    job = JobSpec(script="train.py", compute="cpu", processes_per_node=1, image=IMAGE,
                  outputs=[OutputSpec("m", "s3://bucket/x")])
    with pytest.raises(JobSpecError, match=r"^--output m: s3://bucket/x is not a datastore path"):
        resolve(job)


@pytest.mark.parametrize("value", ["m=s3://bucket/x", "m=/local/dir", "ckpt=azureml:mymodel:1",
                                   f"m={DATASTORE}:ro_mount"])
def test_the_cli_refuses_each_output_in_one_line_and_writes_nothing(project, capsys, value):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 "--output-yaml", "../job.yml", "--output", value])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"hvdazure: error: --output {value.partition('=')[0]}: ")
    assert err.count("\n") == 1
    assert not (project.parent / "job.yml").exists()


def test_name_colon_mode_reaches_the_rest_body(project, tmp_path):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 "--output-yaml", str(tmp_path / "job.yml"), "--output", "ckpt:upload", "--output",
                 f"best=uri_file:{DATASTORE}best.pt", "--", "--set", "checkpoint_dir=${{outputs.ckpt}}",
                 "--set", "extra.best=${{outputs.best}}"])

    from azure.ai.ml import load_job
    from azure.ai.ml.entities._job.to_rest_functions import to_rest_job_object

    assert code == 0
    outputs = to_rest_job_object(load_job(tmp_path / "job.yml")).as_dict()["properties"]["outputs"]
    assert outputs == {"ckpt": {"mode": "Upload", "jobOutputType": "uri_folder"},
                       "best": {"uri": f"{DATASTORE}best.pt", "mode": "ReadWriteMount",
                                "jobOutputType": "uri_file"}}
