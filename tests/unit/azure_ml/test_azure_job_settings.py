"""A job's own settings (hvdazure/azure/spec/settings.py): `--name`, `--description`, `--max-duration`, the
queue settings of serverless compute (`--job-tier`, `--priority`) and registered outputs, for every kind of
job (command job, Azure ML sweep job, in-job sweep) and both SDKs, offline: the dry run's file says each as
it would be sent, the SDK loads it back (azure-ai-ml's load_job and REST body; azureml-core's run
configuration and HyperDriveConfig), the report and JSON say it, and what an SDK or a compute does not take
is one line. The submissions up to HTTP are in test_azure_submit_v2.py, test_azure_submit_v1.py,
test_azure_sweep.py and test_azure_sweep_v1.py.
"""

from __future__ import annotations

import json

import job_specs
import pytest
import yaml
from job_specs import IMAGE, in_job, rest_body, sweep

from hvdazure.azure import submission
from hvdazure.azure.compute import ClusterSpec
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import JobSpec, OutputSpec, resolve
from hvdazure.azure.v2 import submit as submit_v2
from hvdazure.azure.workspace import WorkspaceRef
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
SERVERLESS_VM = "Standard_NC24ads_A100_v4"  # one A100 per node
SPACE = ("lr: {type: loguniform, min_value: -9.2, max_value: -2.3}\n"
         "batch_size: {type: choice, values: [16, 32]}\n")
KINDS = {"command job": lambda: None, "sweep job": sweep, "in-job sweep": lambda: in_job(ranks_per_trial=2)}
SUBCOMMANDS = {"command job": [], "sweep job": ["sweep"], "in-job sweep": ["in-job-sweep"]}
SETTINGS = {"name": "digits-lr_7", "description": "digits: lr and batch size", "max_duration": 7200}


pytestmark.append(pytest.mark.project(files={"space.yaml": SPACE}, v1=True))


def spec_of(kind: str = "command job", **overrides) -> JobSpec:
    """job_specs.spec() as a job of `kind` (a key of KINDS)."""
    return job_specs.spec(**{"script_args": ["--set", "epochs=3"], "sweep": KINDS[kind](), **overrides})


def serverless(kind: str = "command job", **overrides) -> JobSpec:
    return spec_of(kind, compute="serverless", vm_size=SERVERLESS_VM, processes_per_node=None, **overrides)


def refusal(job: JobSpec, tmp_path, sdk: str = "v2") -> str:
    with pytest.raises(JobSpecError) as error:
        submission.dry_run(job, tmp_path / "job.yml", sdk=sdk)
    assert not (tmp_path / "job.yml").exists()
    assert "\n" not in str(error.value)
    return str(error.value)


# --- name, description, max duration: every kind, both SDKs ------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_v2_every_kind_of_job_is_named_described_and_bounded_as_asked(project, tmp_path, kind):
    result = submission.dry_run(spec_of(kind, **SETTINGS), tmp_path / "job.yml")

    written = yaml.safe_load((tmp_path / "job.yml").read_text())
    assert (written["name"], written["description"], written["limits"]["timeout"]) == (
        "digits-lr_7", "digits: lr and batch size", 7200)
    loaded, body = rest_body(tmp_path / "job.yml")
    assert (loaded.name, body["description"], body["limits"]["timeout"]) == (
        "digits-lr_7", "digits: lr and batch size", "PT2H")  # a sweep job's own timeout, not its trial's
    assert "limits" not in body.get("trial", {})
    report = result.report()
    assert "experiment: project; display name: train.py 2x4; name: digits-lr_7" in report
    assert "description: digits: lr and batch size" in report
    assert "max duration: 2h (7200 s), then Azure ML cancels the job" in report
    assert result.check.checked.endswith("; the job's name, description, timeout as asked")
    assert {key: result.as_dict()[key] for key in ("name", "description", "max_duration")} == SETTINGS


@pytest.mark.parametrize("kind", KINDS)
def test_v1_every_kind_of_run_is_named_described_and_bounded_as_asked(project, tmp_path, kind):
    result = submission.dry_run(spec_of(kind, **SETTINGS), tmp_path / "run.yml", sdk="v1")

    written = yaml.safe_load((tmp_path / "run.yml").read_text())
    assert (written["runId"], written["description"]) == ("digits-lr_7", "digits: lr and batch size")
    if kind == "sweep job":  # HyperDrive's own bound; each trial's is --trial-timeout (none: 30 days)
        assert written["hyperdrive"]["max_duration_minutes"] == 120
        assert written["run_configuration"]["maxRunDurationSeconds"] == 2592000
    else:
        assert written["maxRunDurationSeconds"] == 7200
    assert "max duration: 2h (7200 s), then Azure ML cancels the job" in result.report()
    assert result.check.checked.split("; ")[-1] == "the run's runId and description as asked"


def test_without_them_azure_ml_names_the_job_and_no_limit_is_written(project, tmp_path):
    result = submission.dry_run(spec_of(), tmp_path / "job.yml")
    submission.dry_run(spec_of(), tmp_path / "run.yml", sdk="v1")

    written = yaml.safe_load((tmp_path / "job.yml").read_text())
    assert not {"name", "description", "limits", "queue_settings"} & set(written)
    assert not {"runId", "description"} & set(yaml.safe_load((tmp_path / "run.yml").read_text()))
    assert result.as_dict()["name"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_cli_takes_name_description_and_max_duration_for_every_kind(project, capsys, kind):
    code = main(["submit", *SUBCOMMANDS[kind], "train.py", "--compute", "gpu-cluster", "--nodes", "2", "-ppn",
                 "4", "--image", IMAGE, "--dry-run", "--json", "--name", "digits-lr_7", "--description",
                 "digits: lr and batch size", "--max-duration", "7200",
                 *(["--space", "space.yaml", "--metric", "eval_loss"] if kind != "command job" else []),
                 *(["--ranks-per-trial", "2"] if kind == "in-job sweep" else [])])

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {key: result[key] for key in ("name", "description", "max_duration")} == SETTINGS


def cli_job(kind: str, *options: str) -> list[str]:
    """`hvdazure submit` of `kind` as a dry run, with `options`."""
    return ["submit", *SUBCOMMANDS[kind], "train.py", "--compute", "gpu-cluster", "--nodes", "2", "-ppn", "4",
            "--image", IMAGE, "--dry-run", *options,
            *(["--space", "space.yaml", "--metric", "eval_loss"] if kind != "command job" else []),
            *(["--ranks-per-trial", "2"] if kind == "in-job sweep" else [])]


@pytest.mark.parametrize("kind", KINDS)
def test_cli_takes_a_max_duration_with_units_and_sends_it_in_seconds(project, tmp_path, capsys, kind):
    assert main(cli_job(kind, "--max-duration", "1h30m", "--output-yaml", str(tmp_path / "job.yml"))) == 0

    assert yaml.safe_load((tmp_path / "job.yml").read_text())["limits"]["timeout"] == 5400
    assert rest_body(tmp_path / "job.yml")[1]["limits"]["timeout"] == "PT1H30M"
    assert "max duration: 1h30m (5400 s), then Azure ML cancels the job" in capsys.readouterr().out


@pytest.mark.parametrize(("given", "seconds"), [("90m", 5400), ("1.5h", 5400), ("2h", 7200), ("1d", 86400),
                                                ("3600s", 3600), ("3600", 3600)])
def test_cli_max_duration_forms_reach_sdk_v1_in_seconds(project, tmp_path, capsys, given, seconds):
    assert main(cli_job("command job", "--max-duration", given, "--sdk", "v1", "--output-yaml",
                        str(tmp_path / "run.yml"))) == 0

    assert yaml.safe_load((tmp_path / "run.yml").read_text())["maxRunDurationSeconds"] == seconds


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("given", "message"), [
    ("2x", "--max-duration 2x: not a duration; use seconds (90) or units: 90s, 15m, 2h, 1d, 1h30m"),
    ("1h30", "--max-duration 1h30: not a duration; use seconds (90) or units: 90s, 15m, 2h, 1d, 1h30m"),
    ("30s", "--max-duration must be at least 60 seconds, got 30s: Azure ML reads a shorter duration as days "
            "(azure-ai-ml raises a sweep's to 60 s)"),
])
def test_cli_refuses_a_bad_max_duration_in_one_line_before_the_workspace_is_sought(project, tmp_path, capsys,
                                                                                   monkeypatch, kind, given,
                                                                                   message):
    def no_workspace(args):
        raise AssertionError("sought the workspace")

    monkeypatch.setattr("hvdazure.azure.options.workspace", no_workspace)
    argv = [arg for arg in cli_job(kind, "--max-duration", given) if arg != "--dry-run"]

    assert main(argv) == 2
    assert capsys.readouterr().err == f"hvdazure: error: {message}\n"


@pytest.mark.parametrize("name", ["a", "7", "digits-lr_7", "Digits_LR-7", "d" * 256])
def test_a_job_name_azure_ml_takes_is_kept_as_given(project, name):
    assert resolve(spec_of(name=name)).name == name


@pytest.mark.parametrize("name", ["-digits", "_digits", "digits.7", "digits 7", "digits/7", "dígits", "",
                                  "d" * 257])
def test_cli_refuses_a_job_name_azure_ml_would_not_take_in_one_line(project, capsys, name):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 f"--name={name}"])

    assert code == 2
    assert capsys.readouterr().err == (f"hvdazure: error: --name {name!r}: 1 to 256 letters, digits, '_' and "
                                       "'-', starting with a letter or digit (Azure ML's job names)\n")


def test_a_credential_in_the_description_is_refused_without_echoing_it(project, tmp_path):
    message = refusal(spec_of(description="see https://a.blob.core.windows.net/c?sv=1&sig=SECRET"), tmp_path)

    assert message.startswith("--description: looks like a credential (a SAS signature, sig=)")
    assert "SECRET" not in message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("seconds", "message"), [
    (59, "--max-duration must be at least 60 seconds, got 59: Azure ML reads a shorter duration as days"),
    (0, "--max-duration must be at least 60 seconds, got 0"),
    ("30s", "--max-duration must be at least 60 seconds, got 30s: Azure ML reads a shorter duration as days"),
    (-5, "--max-duration -5: not a duration; use seconds (90) or units: 90s, 15m, 2h, 1d, 1h30m"),
    ("2x", "--max-duration 2x: not a duration; use seconds (90) or units: 90s, 15m, 2h, 1d, 1h30m"),
    ("90.5", "--max-duration 90.5: not a whole number of seconds (90.5 s)"),
    (True, "--max-duration True: not a duration"),
])
def test_a_max_duration_azure_ml_would_misread_is_refused_for_every_kind(project, tmp_path, kind, seconds,
                                                                         message):
    assert refusal(spec_of(kind, max_duration=seconds), tmp_path).startswith(message)


def test_the_offline_check_catches_a_file_that_no_longer_says_the_settings_asked(project, tmp_path):
    job = resolve(spec_of(**SETTINGS))
    api = submit_v2.V2Sdk()
    files = api.write_yaml(job, tmp_path / "job.yml")
    written = yaml.safe_load(files[-1].read_text())
    written["limits"]["timeout"] = 3600
    files[-1].write_text(yaml.safe_dump(written))

    with pytest.raises(SubmitError, match=r"^job\.yml does not load back with the timeout asked for: 3600 != "
                                          r"7200$"):
        api.validate_offline(job, files)


# --- queue settings: serverless compute, SDK v2 ------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_serverless_compute_takes_a_job_tier_and_a_priority_for_every_kind(project, tmp_path, kind):
    result = submission.dry_run(serverless(kind, job_tier="spot", priority="high"), tmp_path / "job.yml")

    written = yaml.safe_load((tmp_path / "job.yml").read_text())
    assert written["queue_settings"] == {"job_tier": "spot", "priority": "high"}
    _, body = rest_body(tmp_path / "job.yml")
    assert body["queueSettings"] == {"jobTier": "Spot", "priority": 3}  # as azure-ai-ml sends a priority
    assert "computeId" not in body  # no compute: Azure ML's serverless compute
    assert "compute" not in written
    layout = body.get("trial", body)
    assert (layout["resources"]["instanceType"], layout["resources"]["instanceCount"]) == (SERVERLESS_VM, 2)
    assert layout["distribution"]["processCountPerInstance"] == 1  # the VM size's GPUs
    assert ("MPI layout: 2 node(s) x 1 process(es) = world size 2, on serverless compute "
            f"({SERVERLESS_VM})") in result.report()
    assert "queue: job tier spot, priority high" in result.report()
    assert result.as_dict()["queue_settings"] == {"job_tier": "spot", "priority": "high"}


def test_cli_takes_the_job_tier_and_priority_in_any_case(project, capsys):
    code = main(["submit", "train.py", "--compute", "serverless", "--vm-size", SERVERLESS_VM, "--image",
                 IMAGE, "--dry-run", "--json", "--job-tier", "Standard", "--priority", "LOW"])

    queue = json.loads(capsys.readouterr().out)["queue_settings"]
    assert code == 0
    assert queue == {"job_tier": "standard", "priority": "low"}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"job_tier": "spot"}, "--job-tier is a queue setting of serverless compute (--compute serverless): "
                           "compute gpu-cluster's VMs are dedicated or low priority as the cluster was "
                           "created (hvdazure azure compute create --low-priority)"),
    ({"priority": "high"}, "--priority is a queue setting of serverless compute (--compute serverless): "
                           "compute gpu-cluster's VMs"),
    ({"compute": "serverless", "vm_size": SERVERLESS_VM, "job_tier": "premium"},
     "--job-tier premium: a tier of Singularity virtual clusters, which hvdazure does not submit to; "
     "serverless compute's are spot and standard"),
    ({"compute": "serverless", "vm_size": SERVERLESS_VM, "job_tier": "dedicated"},
     "--job-tier 'dedicated': expected spot or standard"),
    ({"compute": "serverless", "vm_size": SERVERLESS_VM, "priority": "urgent"},
     "--priority 'urgent': expected low, medium, high"),
    ({"compute": "serverless"}, "--compute serverless needs --vm-size, the VM each node is (e.g. "
                                "Standard_NC24ads_A100_v4): Azure ML would pick a CPU VM"),
])
def test_queue_settings_where_azure_ml_takes_none_are_one_line(project, tmp_path, overrides, message):
    assert refusal(spec_of(**overrides), tmp_path).startswith(message)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"job_tier": "spot"}, "--job-tier needs SDK v2 (the default): azureml-core has no queue settings, and "
                           "no serverless compute"),
    ({"priority": "low"}, "--priority needs SDK v2 (the default)"),
    ({}, "--compute serverless needs SDK v2 (the default): azureml-core has no serverless compute"),
])
@pytest.mark.parametrize("kind", KINDS)
def test_sdk_v1_refuses_serverless_compute_and_queue_settings_in_one_line(project, tmp_path, kind, overrides,
                                                                          message):
    assert refusal(serverless(kind, **overrides), tmp_path, sdk="v1").startswith(message)


def test_create_compute_with_serverless_compute_is_refused_before_any_azure_call(project):
    with pytest.raises(JobSpecError, match=r"^--create-compute goes with a compute cluster: serverless "
                                           r"compute is Azure ML's, there is none to create$"):
        submission.submit(serverless(), WorkspaceRef("sub-id", "rg", "ws"), credential=object(),
                          create_compute=ClusterSpec("serverless", SERVERLESS_VM, max_nodes=None))


# --- outputs: the model types, registered as assets --------------------------------------------------------
MODEL = OutputSpec("model", type="mlflow_model", mode="upload", asset_name="digits-model", asset_version="3")
CHECKPOINTS = OutputSpec("ckpt", asset_name="digits-ckpt")
USES_BOTH = ["--set", "checkpoint_dir=${{outputs.ckpt}}", "--set", "extra.model=${{outputs.model}}"]


@pytest.mark.parametrize("kind", ["command job", "in-job sweep"])
def test_outputs_of_the_model_types_are_registered_as_the_assets_asked(project, tmp_path, kind):
    result = submission.dry_run(spec_of(kind, outputs=[MODEL, CHECKPOINTS], script_args=USES_BOTH),
                                tmp_path / "job.yml")

    written = yaml.safe_load((tmp_path / "job.yml").read_text())["outputs"]
    assert written["model"] == {"name": "digits-model", "version": "3", "mode": "upload",
                                "type": "mlflow_model"}
    _, body = rest_body(tmp_path / "job.yml")
    assert body["outputs"] == {
        "model": {"assetName": "digits-model", "assetVersion": "3", "mode": "Upload",
                  "jobOutputType": "mlflow_model"},
        "ckpt": {"assetName": "digits-ckpt", "mode": "ReadWriteMount", "jobOutputType": "uri_folder"}}
    report = result.report()
    assert ("output model: mlflow_model (default datastore) (upload, registered as model digits-model, "
            "version 3)") in report
    assert ("output ckpt: uri_folder (default datastore) (rw_mount, registered as data asset digits-ckpt, "
            "its next version)") in report
    assert result.as_dict()["outputs"][0] == {"name": "model", "uri": None, "type": "mlflow_model",
                                              "mode": "upload", "asset_name": "digits-model",
                                              "asset_version": "3"}


def test_cli_registers_an_output_given_with_name_and_version(project, tmp_path, capsys):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 "--output-yaml", str(tmp_path / "job.yml"), "--output",
                 "model=custom_model:upload,name=digits-model,version=3", "--", "--set",
                 "extra.model=${{outputs.model}}"])

    assert code == 0
    _, body = rest_body(tmp_path / "job.yml")
    assert body["outputs"]["model"] == {"assetName": "digits-model", "assetVersion": "3", "mode": "Upload",
                                        "jobOutputType": "custom_model"}


def test_a_sweep_jobs_outputs_take_the_model_types_but_no_registration(project, tmp_path):
    submission.dry_run(spec_of("sweep job", outputs=[OutputSpec("model", type="custom_model")],
                               script_args=["--set", "extra.model=${{outputs.model}}"]), tmp_path / "job.yml")
    _, body = rest_body(tmp_path / "job.yml")

    assert body["outputs"]["model"]["jobOutputType"] == "custom_model"
    job = spec_of("sweep job", outputs=[MODEL], script_args=USES_BOTH[2:])
    assert refusal(job, tmp_path / "refused") == (
        "--output model: name=digits-model registers a job's output, and each trial of a sweep writes its "
        "own: register the best trial's after the sweep (az ml model create or az ml data create, from "
        "azureml://jobs/TRIAL/outputs/model)")


def test_sdk_v1_refuses_outputs_of_every_type(project, tmp_path):
    assert refusal(spec_of(outputs=[MODEL], script_args=USES_BOTH[2:]), tmp_path, sdk="v1") == (
        "--input and --output need SDK v2 (the default); with --sdk v1, pass the script a datastore path "
        "instead")
