"""`hvdazure submit`'s own validation, before anything is uploaded: each wrong job is one line naming the
option. Many of these the SDK accepts silently (see test_azure_dry_run.py), so they are ours to catch.
No Azure SDK is needed here."""

from __future__ import annotations

import json
from functools import partial

import job_specs
import pytest
from job_specs import IMAGE

from hvdazure.azure import code_snapshot, vm_sizes
from hvdazure.azure.errors import JobSpecError, SubmitError, redact, redacted_line
from hvdazure.azure.spec.job import InputSpec, OutputSpec, parse_input, parse_output, resolve
from hvdazure.azure.workspace import WorkspaceRef

pytestmark = pytest.mark.project(script="src/train.py")  # the `project` fixture (conftest.py)
spec = partial(job_specs.spec, script="src/train.py")


def refused(**overrides) -> str:
    with pytest.raises(JobSpecError) as error:
        resolve(spec(**overrides))
    message = str(error.value)
    assert "\n" not in message
    return message


# --- the layout -------------------------------------------------------------------------------------------
def test_a_valid_job_runs_python_on_the_script_from_the_top_of_the_code_directory(project):
    job = resolve(spec(script_args=["--set", "epochs=3", "--name", "two words"]))

    assert (job.nodes, job.processes_per_node, job.world_size) == (2, 4, 8)
    assert job.code_dir == project
    assert job.command == "python src/train.py --set epochs=3 --name 'two words'"
    assert job.experiment == "project"  # the code directory's name, not whatever the current one is
    assert job.display_name == "train.py 2x4"


@pytest.mark.parametrize(("option", "value", "message"), [
    ("nodes", 0, "--nodes must be at least 1, got 0"),
    ("nodes", -2, "--nodes must be at least 1, got -2"),
    ("nodes", 1.5, "--nodes must be an integer, got 1.5"),
    ("nodes", "2", "--nodes must be an integer, got '2'"),
    ("nodes", True, "--nodes must be an integer, got True"),
    ("processes_per_node", 0, "--processes-per-node must be at least 1, got 0"),
    ("processes_per_node", -1, "--processes-per-node must be at least 1, got -1"),
])
def test_counts_must_be_integers_of_at_least_one(project, option, value, message):
    assert refused(**{option: value}) == message


def test_processes_per_node_default_to_the_gpus_of_a_known_vm_size(project):
    # spelled as the service reports it
    job = resolve(spec(processes_per_node=None), vm_size="STANDARD_ND96ISR_H100_V5")

    assert job.processes_per_node == 8


def test_more_processes_per_node_than_the_vm_sizes_gpus_is_a_warning_naming_both(project):
    job = resolve(spec(processes_per_node=16), vm_size="Standard_ND96asr_v4")

    assert ("--processes-per-node 16 is more than the 8 GPU(s) of a Standard_ND96asr_v4 node: ranks would "
            "share GPUs (one process per GPU is usual)") in job.warnings
    for fits in (resolve(spec(processes_per_node=8), vm_size="Standard_ND96asr_v4"),
                 resolve(spec(processes_per_node=16), vm_size="Standard_D4s_v5"), resolve(spec())):
        assert not [w for w in fits.warnings if "GPU(s)" in w]


def test_processes_per_node_are_required_when_the_vm_size_is_unknown(project):
    assert refused(processes_per_node=None).startswith(
        "--processes-per-node is required: the compute's VM size is unknown")
    assert refused(processes_per_node=None, vm_size="Standard_D4s_v5").startswith(
        "--processes-per-node is required: VM size Standard_D4s_v5 is not in hvdazure's table")


@pytest.mark.parametrize(("vm_size", "expected"), [
    ("Standard_ND96asr_v4", {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_PCI_RELAXED_ORDERING": "1",
                             "UCX_IB_PCI_RELAXED_ORDERING": "on", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                             "NCCL_DEBUG": "WARN"}),
    ("Standard_NC24ads_A100_v4", {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1",
                                  "NCCL_DEBUG": "WARN"}),
    ("Standard_D4s_v5", {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}),
    (None, {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}),
])
def test_nccl_settings_follow_the_vm_size(vm_size, expected):
    assert vm_sizes.nccl_environment(vm_size) == expected


def test_the_users_variables_override_the_nccl_defaults(project):
    env = {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "INFO"}
    job = resolve(spec(env=env), vm_size="Standard_NC24ads_A100_v4")

    assert job.env == {"OMPI_MCA_mpi_yield_when_idle": "1", "NCCL_SOCKET_IFNAME": "eth0",
                        "NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "INFO"}


# --- the code ---------------------------------------------------------------------------------------------
def test_a_missing_script_or_code_directory_is_refused(project):
    assert refused(script="src/nope.py") == f"script not found: src/nope.py (no such file in {project})"
    assert refused(code_dir="nowhere") == "code directory not found: nowhere"


def test_the_script_is_a_path_in_the_code_directory(project):
    """As the job runs it: `python train.py` from the top of `--code src`."""
    (project / "train.py").write_text("print('a different script, outside the code directory')\n")

    job = resolve(spec(code_dir="src", script="train.py"))
    assert (job.code_dir, job.script, job.command) == (project / "src", "train.py", "python train.py")


def test_a_path_from_the_current_directory_into_the_code_directory_is_taken_too(project):
    assert resolve(spec(code_dir="src", script="src/train.py")).script == "train.py"
    assert refused(code_dir="src", script="nope.py") == (
        f"script not found: nope.py (no such file in {project / 'src'} or {project})")


@pytest.mark.parametrize("name", ["bad name!", "gpu_cluster", "1gpu", "x", "a" * 33, "azureml:gpu-cluster"])
def test_a_compute_name_azure_ml_cannot_have_is_refused(project, name):
    assert refused(compute=name) == (f"--compute {name!r}: 2 to 32 letters, digits and '-', starting with a "
                                     "letter (Azure ML's compute names)")
    assert refused(compute=" ") == "--compute: name the Azure ML compute cluster to run on"


@pytest.mark.parametrize("name", ["gpu-cluster", "A100x8", "nc", "a" * 32, "cpu-cluster-2"])
def test_compute_names_azure_ml_takes_pass(project, name):
    assert resolve(spec(compute=name)).compute == name


def test_a_script_outside_the_code_directory_is_refused(project):
    (project / "outside.py").write_text("")

    assert refused(code_dir="src", script="outside.py") == (
        f"script outside.py is outside the code directory {project / 'src'}: only the code directory is "
        f"uploaded (pass --code {project})")


def test_a_script_excluded_by_amlignore_is_refused(project):
    (project / ".amlignore").write_text("src/\n")

    assert refused() == f"script src/train.py is excluded by {project}/.amlignore: it would not be uploaded"


def test_amlignore_wins_over_gitignore_and_negation_reincludes(project):
    (project / "data").mkdir()
    (project / "data" / "a.bin").write_bytes(b"1")
    (project / "data" / "keep.txt").write_text("1")
    (project / ".gitignore").write_text("src/\n")  # ignored: .amlignore exists
    (project / ".amlignore").write_text("data/*\n!data/keep.txt\n")

    snapshot = code_snapshot.scan(project)

    assert set(snapshot.files) == {".amlignore", ".gitignore", "data/keep.txt", "src/train.py"}
    assert snapshot.ignore_file == ".amlignore"


def test_gitignore_applies_without_amlignore_and_whole_directories_are_skipped(project):
    (project / ".venv" / "lib").mkdir(parents=True)
    (project / ".venv" / "lib" / "big.so").write_bytes(b"x" * 100)
    (project / ".gitignore").write_text(".venv/\n*.pyc\n")
    (project / "src" / "train.pyc").write_bytes(b"x")

    assert set(code_snapshot.scan(project).files) == {".gitignore", "src/train.py"}


def test_a_large_code_directory_warns_with_its_largest_entries(project, monkeypatch):
    monkeypatch.setattr(code_snapshot, "WARN_FILES", 5)
    (project / "data").mkdir()
    for index in range(6):
        (project / "data" / f"{index}.bin").write_bytes(b"x" * 2**20)

    (warning,) = resolve(spec()).warnings

    assert warning.startswith(f"the code directory {project} holds 7 files, 6 MB to upload (no .amlignore or "
                              ".gitignore): above Azure ML's snapshot limit of 300 MB or 5 files; largest: "
                              "data/ 6 MB, src/ 0 MB")


def test_a_small_code_directory_does_not_warn(project):
    assert resolve(spec()).warnings == ()


# --- the environment --------------------------------------------------------------------------------------
def test_an_image_becomes_a_named_environment_versioned_by_its_content(project):
    first, again = resolve(spec()).environment, resolve(spec()).environment
    other = resolve(spec(image="myacr.azurecr.io/hvdazure-gpu:0.2.0")).environment

    assert (first.name, first.image, first.registered) == ("hvdazure-gpu", IMAGE, False)
    assert first.version == again.version and first.version.startswith("0.1.0-")
    assert other.version.startswith("0.2.0-") and other.version != first.version


def test_a_conda_file_changes_the_environments_version(project):
    (project / "env.yml").write_text("dependencies:\n  - pip:\n    - rich\n")
    plain = resolve(spec()).environment
    with_conda = resolve(spec(conda_file="env.yml")).environment

    assert with_conda.conda_file == project / "env.yml"
    assert with_conda.name == plain.name and with_conda.version != plain.version


@pytest.mark.parametrize(("given", "name", "version"), [
    ("azureml:hvdazure-gpu@latest", "hvdazure-gpu", None),
    ("azureml:hvdazure-gpu:3", "hvdazure-gpu", "3"),
    ("my-env:0.1.0", "my-env", "0.1.0"),
])
def test_a_registered_environment_is_referenced_not_created(project, given, name, version):
    environment = resolve(spec(image=None, environment=given)).environment

    assert (environment.name, environment.version, environment.registered) == (name, version, True)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"image": None}, "no environment: give --image REGISTRY/IMAGE:TAG"),
    ({"environment": "azureml:x@latest"}, "--environment names a registered environment: give it alone"),
    ({"image": None, "environment": "azureml:x"}, "--environment 'azureml:x': expected azureml:NAME@latest"),
    ({"image": "https://myacr.azurecr.io/x"}, "--image 'https://myacr.azurecr.io/x': expected REGISTRY/"),
    ({"conda_file": "missing.yml"}, "conda file not found: missing.yml"),
])
def test_environment_mistakes_are_refused(project, overrides, message):
    assert refused(**overrides).startswith(message)


# --- variables, inputs, outputs -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AZURE_CLIENT_SECRET", "DB_PASSWORD",
                                  "AZURE_STORAGE_CONNECTION_STRING"])
def test_variables_named_like_credentials_are_refused(project, name):
    assert refused(env={name: "value"}).startswith(f"--env {name}: looks like a credential")


def test_variable_values_that_are_credentials_are_refused(project):
    sas_url = "https://acct.blob.core.windows.net/c?sv=2021&sig=abc"
    assert refused(env={"DATA_URL": sas_url}).startswith("--env DATA_URL: looks like a credential")


def test_ordinary_variables_pass(project):
    env = {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "INFO", "KEYBOARD": "us"}

    assert resolve(spec(env=env)).env.items() >= env.items()


@pytest.mark.parametrize(("text", "expected"), [
    ("data=azureml:digits@latest", InputSpec("data", "azureml:digits@latest", "uri_folder", "ro_mount")),
    ("data=azureml:digits:3:download", InputSpec("data", "azureml:digits:3", "uri_folder", "download")),
    ("w=uri_file:azureml://datastores/ws/paths/w.pt", InputSpec("w", "azureml://datastores/ws/paths/w.pt",
                                                                 "uri_file", "ro_mount")),
    ("raw=https://acct.blob.core.windows.net/c/", InputSpec("raw", "https://acct.blob.core.windows.net/c/")),
])
def test_inputs_parse(text, expected):
    assert parse_input(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("data", "--input expects KEY=VALUE, got 'data'"),
    ("=azureml:x@latest", "--input expects KEY=VALUE"),
    ("1data=azureml:x@latest", "--input name '1data': letters, digits and '_'"),
    ("data=", "--input data: no URI"),
    ("data=https://acct.blob.core.windows.net/c?sig=secret", "--input data: looks like a credential"),
])
def test_inputs_that_do_not_parse_are_refused(text, message):
    with pytest.raises(JobSpecError, match="^" + message.replace("?", r"\?")):
        parse_input(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("model", OutputSpec("model")),
    ("model=azureml://datastores/ws/paths/out:upload", OutputSpec("model", "azureml://datastores/ws/paths/out",
                                                                   mode="upload")),
])
def test_outputs_parse(text, expected):
    assert parse_output(text) == expected


def test_placeholders_must_name_declared_inputs_and_outputs(project):
    assert refused(script_args=["--data", "${{inputs.data}}"]) == (
        "the script's arguments use ${{inputs.data}}, which the job does not define: declare it with "
        "--input/--output")
    assert refused(script_args=["${{search_space.lr}}"]).endswith(
        "only ${{inputs.NAME}} and ${{outputs.NAME}} are substituted")


def test_an_input_the_script_is_not_told_about_is_a_warning(project):
    job = resolve(spec(inputs=[InputSpec("data", "azureml:digits@latest")]))

    assert job.warnings == ("--input data is not referenced in the script's arguments, so the script is not "
                             "told its path: pass it, e.g. -- --set extra.data='${{inputs.data}}'",)


def test_a_local_input_must_exist(project):
    (project / "digits").mkdir()

    assert resolve(spec(inputs=[InputSpec("data", "digits")], script_args=["${{inputs.data}}"])).inputs
    assert refused(inputs=[InputSpec("data", "missing/")]) == (
        "--input data: missing/ does not exist (a local path is uploaded)")


def test_inputs_and_outputs_are_unique(project):
    two = [InputSpec("data", "azureml:a@latest"), InputSpec("data", "azureml:b@latest")]
    assert refused(inputs=two) == "--input data is given twice"


# --- the script's TrainConfig arguments -------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--set", "batch_size=0"], "the script's arguments: config field 'batch_size': 0 must be at least 1"),
    (["--set=epochs=two"], "the script's arguments: config field 'epochs': 'two' is not an integer"),
    (["--set", "epoch=3"], "the script's arguments: unknown config field 'epoch'"),
    (["--set", "epochs"], "the script's arguments: --set expects FIELD=VALUE, got 'epochs'"),
    (["--config", "cfg.yaml"], "the script's arguments: config file not found: "),
])
def test_set_and_config_are_parsed_as_the_job_will(project, args, message):
    assert refused(script_args=args).startswith(message)


def test_config_files_are_read_from_the_code_directory_and_placeholders_stand_for_paths(project, tmp_path):
    (project / "cfg.yaml").write_text("epochs: 4\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    args = ["--config", "cfg.yaml", "--set", "checkpoint_dir=${{outputs.ckpt}}", "--data-dir", "/x"]

    job = resolve(spec(code_dir=str(project), script=str(project / "src" / "train.py"), script_args=args,
                        outputs=[OutputSpec("ckpt")]), cwd=outside)

    assert job.script_args == tuple(args)  # the script's own --data-dir is left alone


def test_shm_size_and_experiment_names_are_checked(project):
    assert refused(shm_size="lots") == ("--shm-size 'lots': a whole number and a unit, b, k, m or g, such as "
                                        "16g or 512m")
    assert refused(experiment="my experiment").startswith("--experiment 'my experiment': letters, digits")
    assert resolve(spec(shm_size="16g", experiment="digits_v2")).shm_size == "16g"


@pytest.mark.parametrize("size", ["16", "0g", "1.5g", "16gb", "16GiB", "2t", "16 g", "-1g"])
def test_a_shm_size_docker_would_misread_or_refuse_is_refused(project, size):
    message = refused(shm_size=size)

    assert message.startswith(f"--shm-size {size!r}: ")
    if size == "16":  # Docker reads a bare number as bytes: a 16-byte /dev/shm
        assert message == "--shm-size '16': give a unit, such as 16g: Docker reads a bare number as bytes"


@pytest.mark.parametrize(("size", "written"), [("16g", "16g"), ("16G", "16g"), ("512m", "512m"),
                                               ("1048576k", "1048576k"), ("4096B", "4096b")])
def test_a_shm_size_with_a_unit_is_written_as_azure_ml_spells_it(project, size, written):
    assert resolve(spec(shm_size=size)).shm_size == written


# --- secrets and workspaces -------------------------------------------------------------------------------
def test_redact_removes_sas_signatures_tokens_and_keys():
    text = ("PUT https://acct.blob.core.windows.net/c/f?sv=2021-08-06&se=2026&sig=AbC%2Bd= failed; "
            "Authorization: Bearer abc.def.ghi; AccountKey=k3y==; "
            "token eyJhbGciOiJub25lIn0.eyJ0aWQiOiJ4In0.sig")

    cleaned = redact(text)

    for secret in ("AbC%2Bd=", "abc.def.ghi", "k3y==", "eyJhbGciOiJub25lIn0"):
        assert secret not in cleaned
    assert "https://acct.blob.core.windows.net/c/f?sv=REDACTED&se=REDACTED&sig=REDACTED" in cleaned


def test_one_line_keeps_the_first_line_redacted():
    error = RuntimeError("upload to https://a.blob.core.windows.net/c?sig=s3cret failed\nmore\ndetail")

    assert redacted_line(error) == (
        "RuntimeError: upload to https://a.blob.core.windows.net/c?sig=REDACTED failed")


def test_azure_ai_mls_coloured_errors_are_one_line_of_what_and_why():
    """azure-ai-ml 1.35.2's MlException text, as a failed submission raised it."""
    error = RuntimeError(
        "\n\x1b[37m\n\x1b[30m\n1) One or more fields are invalid\x1b[39m\x1b[39m\n\nDetails: \n\n"
        "\x1b[31m(x) Could not parse azureml:data:x. If providing an ARM id, it should start with a '/'."
        "\x1b[39m\n\nResolutions: \n1) Double-check that all specified parameters are of the correct types\n")

    assert redacted_line(error) == ("RuntimeError: One or more fields are invalid: Could not parse "
                                    "azureml:data:x. If providing an ARM id, it should start with a '/'.")


def test_the_workspace_comes_from_config_json_found_upwards(tmp_path):
    (tmp_path / ".azureml").mkdir()
    (tmp_path / ".azureml" / "config.json").write_text(json.dumps(
        {"subscription_id": "s", "resource_group": "g", "workspace_name": "w"}))
    (tmp_path / "deep" / "er").mkdir(parents=True)

    assert WorkspaceRef.from_options(cwd=tmp_path / "deep" / "er") == WorkspaceRef("s", "g", "w")


@pytest.mark.parametrize(("options", "message"), [
    ({}, "no Azure ML workspace given: pass --workspace-config config.json"),
    ({"subscription_id": "s", "workspace_name": "w"}, "the workspace is named by three ids: --resource-gr"),
    ({"config": "missing.json"}, "workspace config not found: missing.json"),
])
def test_a_missing_workspace_is_one_line(tmp_path, options, message):
    with pytest.raises(SubmitError, match="^" + message):
        WorkspaceRef.from_options(cwd=tmp_path, **options)


@pytest.mark.parametrize(("config", "missing"), [
    ({"subscription_id": "s"}, "resource_group, workspace_name"),
    ({"subscription_id": "s", "resource_group": "g", "workspace_name": ""}, "workspace_name"),
    ({"workspace_name": "w"}, "subscription_id, resource_group"),
    ({}, "subscription_id, resource_group, workspace_name"),
])
def test_a_config_json_without_ids_names_the_missing_ones(tmp_path, config, missing):
    (tmp_path / "config.json").write_text(json.dumps(config))

    with pytest.raises(SubmitError) as error:
        WorkspaceRef.from_config_file(tmp_path / "config.json")
    assert str(error.value) == (f"workspace config {tmp_path / 'config.json'} lacks {missing} (the "
                                "workspace's portal page downloads a complete one)")
