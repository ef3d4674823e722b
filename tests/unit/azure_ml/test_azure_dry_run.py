"""`hvdazure submit --dry-run`: the job YAML, checked offline by the SDK itself, with no Azure access.

SDK v2: the YAML loads with azure-ai-ml's `load_job`, and its REST body (what the service would receive) has
an MPI distribution with the asked processes per node, the node count, image, variables, inputs and the
command `python train.py ...`. SDK v1: the serialised run configuration loads back with azureml-core.
Also here: what the SDK accepts silently, which is why hvdazure validates first.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import job_specs
import pytest
import yaml
from job_specs import IMAGE, rest_body

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import InputSpec, OutputSpec, resolve
from hvdazure.azure.v2 import submit as submit_v2
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


spec = partial(job_specs.spec, script_args=["--set", "epochs=3"])


def test_the_yaml_loads_with_load_job_into_an_mpi_job_of_the_asked_layout(project, tmp_path):
    job = spec(env={"NCCL_DEBUG": "INFO"}, shm_size="16g")
    result = submission.dry_run(job, tmp_path / "out" / "job.yml")

    body = rest_body(tmp_path / "out" / "job.yml")[1]  # loaded afresh, as `az ml job create -f` would
    assert body["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 4}
    assert body["resources"] == {"instanceCount": 2, "shmSize": "16g", "properties": {}}
    assert body["command"] == "python train.py --set epochs=3"
    environment = result.job.environment
    assert body["environmentId"] == f"{environment.name}:{environment.version}"  # resolved to an id on submit
    assert body["environmentVariables"] == {"OMPI_MCA_mpi_yield_when_idle": "1", "NCCL_SOCKET_IFNAME": "eth0",
                                           "NCCL_DEBUG": "INFO"}
    assert (body["computeId"], body["experimentName"]) == ("gpu-cluster", "project")
    assert body == result.body


def test_the_code_path_is_relative_to_the_yaml_so_it_can_be_submitted_from_there(project, tmp_path):
    submission.dry_run(spec(), tmp_path / "out" / "job.yml")

    job = yaml.safe_load((tmp_path / "out" / "job.yml").read_text())
    assert job["code"] == "../project"
    assert job["$schema"].endswith("/commandJob.schema.json")


def test_the_environment_to_register_is_written_beside_the_job_and_holds_the_image(project, tmp_path):
    from azure.ai.ml import load_environment

    (project / "env.yml").write_text("dependencies:\n  - pip:\n    - rich\n")
    result = submission.dry_run(spec(conda_file="env.yml"), tmp_path / "job.yml")

    environment_file, job_file = result.files
    assert environment_file == tmp_path / "job.environment.yml"
    environment = load_environment(environment_file)
    assert (environment.name, environment.image) == ("hvdazure-gpu", IMAGE)
    assert environment.version == result.job.environment.version
    assert environment.conda_file == {"dependencies": [{"pip": ["rich"]}]}
    assert yaml.safe_load(job_file.read_text())["environment"] == result.job.environment.reference


def test_a_registered_environment_is_referenced_and_no_environment_file_is_written(project, tmp_path):
    result = submission.dry_run(spec(image=None, environment="azureml:team-env@latest"), tmp_path / "job.yml")

    assert result.files == [tmp_path / "job.yml"]
    assert rest_body(tmp_path / "job.yml")[1]["environmentId"] == "team-env@latest"


def test_inputs_and_outputs_reach_the_rest_body(project, tmp_path):
    job = spec(inputs=[InputSpec("data", "azureml:digits@latest", mode="download")],
               outputs=[OutputSpec("ckpt")],
               script_args=["--set", "extra.data=${{inputs.data}}",
                            "--set", "checkpoint_dir=${{outputs.ckpt}}"])
    submission.dry_run(job, tmp_path / "job.yml")

    body = rest_body(tmp_path / "job.yml")[1]
    assert body["inputs"] == {"data": {"uri": "digits@latest", "mode": "Download",
                                       "jobInputType": "uri_folder"}}
    assert body["outputs"] == {"ckpt": {"mode": "ReadWriteMount", "jobOutputType": "uri_folder"}}
    assert body["command"] == ("python train.py --set 'extra.data=${{inputs.data}}' "
                               "--set 'checkpoint_dir=${{outputs.ckpt}}'")


def test_docker_arguments_reach_the_rest_body(project, tmp_path):
    result = submission.dry_run(spec(docker_args="--user root"), tmp_path / "job.yml")

    assert result.body["resources"]["dockerArgs"] == "--user root"


def test_a_shm_size_reaches_both_sdks_with_its_unit_in_lower_case(project, tmp_path):
    v2 = submission.dry_run(spec(shm_size="16G"), tmp_path / "job.yml")
    submission.dry_run(spec(shm_size="16G"), tmp_path / "run.yml", sdk="v1")

    assert v2.body["resources"]["shmSize"] == "16g"
    assert yaml.safe_load((tmp_path / "run.yml").read_text())["docker"]["shmSize"] == "16g"


def test_cli_refuses_a_shm_size_without_a_unit_in_one_line(project, capsys):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                 "--shm-size", "16"])

    assert code == 2
    assert capsys.readouterr().err == ("hvdazure: error: --shm-size '16': give a unit, such as 16g: Docker "
                                       "reads a bare number as bytes\n")
    assert not (project / "hvdazure-job.yml").exists()


def test_the_processes_per_node_of_a_dry_run_come_from_vm_size(project, tmp_path):
    result = submission.dry_run(spec(processes_per_node=None, vm_size="Standard_ND96isr_H100_v5"),
                                tmp_path / "job.yml")

    assert result.body["distribution"]["processCountPerInstance"] == 8
    assert result.body["environmentVariables"]["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"


@pytest.mark.parametrize("overrides", [{"nodes": 0}, {"processes_per_node": -1}, {"script": "missing.py"}])
def test_bad_counts_and_paths_are_refused_before_anything_is_written(project, tmp_path, overrides):
    with pytest.raises(JobSpecError):
        submission.dry_run(spec(**overrides), tmp_path / "job.yml")

    assert not (tmp_path / "job.yml").exists()


# --- why hvdazure validates first: what azure-ai-ml 1.35.2 accepts ----------------------------------------
def test_load_job_accepts_zero_nodes_and_negative_processes_which_hvdazure_refuses(project, tmp_path):
    submission.dry_run(spec(), tmp_path / "job.yml")
    job = yaml.safe_load((tmp_path / "job.yml").read_text())
    job["resources"]["instance_count"] = 0
    job["distribution"]["process_count_per_instance"] = -4
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(job))

    body = rest_body(tmp_path / "bad.yml")[1]  # no error from the SDK

    assert (body["resources"]["instanceCount"], body["distribution"]["processCountPerInstance"]) == (0, -4)


def test_the_rest_body_catches_an_undefined_input_that_slipped_past(project, tmp_path):
    job = dataclasses.replace(resolve(spec()), script_args=("--data", "${{inputs.data}}"))
    api = submit_v2.V2Sdk()
    files = api.write_yaml(job, tmp_path / "job.yml")

    with pytest.raises(SubmitError, match=r"^Azure ML's validation rejected job\.yml: .* 'data' referenced"):
        api.validate_offline(job, files)


# --- SDK v1 -----------------------------------------------------------------------------------------------
def test_v1_dry_run_serialises_the_run_configuration_and_loads_it_back(project, tmp_path):
    job = spec(shm_size="8g", env={"NCCL_DEBUG": "INFO"})
    result = submission.dry_run(job, tmp_path / "run.yml", sdk="v1")

    config = yaml.safe_load((tmp_path / "run.yml").read_text())
    assert config["mpi"] == {"processCountPerNode": 4, "nodeCount": 2}
    assert (config["script"], config["arguments"], config["target"]) == ("train.py", ["--set", "epochs=3"],
                                                                         "gpu-cluster")
    assert config["docker"] == {"useDocker": True, "sharedVolumes": True, "arguments": [], "shmSize": "8g"}
    assert config["environment"]["docker"]["baseImage"] == IMAGE
    assert config["environmentVariables"] == {"OMPI_MCA_mpi_yield_when_idle": "1",
                                              "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
    assert result.body["mpi"] == config["mpi"]


def test_an_unknown_sdk_is_one_line(project, tmp_path):
    with pytest.raises(JobSpecError, match=r"^--sdk 'v3': expected v2 \(azure-ai-ml, the default\) or v1"):
        submission.dry_run(spec(), tmp_path / "job.yml", sdk="v3")


# --- the CLI ----------------------------------------------------------------------------------------------
def test_cli_dry_run_prints_the_layout_image_and_command(project, capsys):
    code = main(["submit", "train.py", "--compute", "gpu-cluster", "--nodes", "2", "--vm-size",
                 "Standard_ND96asr_v4", "--image", IMAGE, "--dry-run", "--", "--set", "epochs=3"])

    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "dry run (SDK v2): nothing was uploaded or submitted"
    assert "MPI layout: 2 node(s) x 8 process(es) = world size 16, on compute gpu-cluster " \
           "(Standard_ND96asr_v4)" in out
    assert any(line.startswith("environment: azureml:hvdazure-gpu:0.1.0-") and IMAGE in line for line in out)
    assert "command: python train.py --set epochs=3" in out
    written = project.parent / "cache" / "hvdazure" / "dry-run" / "project"
    assert out[-1] == (f"to submit: az ml environment create -f {written}/hvdazure-job.environment.yml && "
                       f"az ml job create -f {written}/hvdazure-job.yml")
    assert (written / "hvdazure-job.yml").is_file()


def test_the_default_files_are_written_outside_the_code_directory_so_a_second_dry_run_counts_the_same(
        project, capsys):
    """The code directory is the current one by default: files written there would be uploaded."""
    argv = ["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run"]
    reports = []
    for _ in range(2):
        assert main(argv) == 0
        reports.append(capsys.readouterr())

    first, second = (next(line for line in r.out.splitlines() if line.startswith("code: ")) for r in reports)
    assert first == second == f"code: {project} (1 files, 0.0 MB)"
    assert sorted(p.name for p in project.iterdir()) == ["train.py"]
    written = project.parent / "cache" / "hvdazure" / "dry-run" / "project"
    assert (f"wrote {written}/hvdazure-job.environment.yml, {written}/hvdazure-job.yml (outside the code "
            "directory, so not uploaded with it)") in reports[1].out.splitlines()
    assert reports[1].err == ""


def test_files_written_into_the_code_directory_are_warned_about_unless_ignored(project, capsys):
    argv = ["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
            "--output-yaml", "jobs/job.yml"]
    assert main(argv) == 0
    assert capsys.readouterr().err == (
        "hvdazure: warning: the dry run's files (jobs/job.environment.yml, jobs/job.yml) are inside the code "
        f"directory {project}, so submissions upload them with the code: write them elsewhere "
        "(--output-yaml) or add them to .amlignore\n")

    (project / ".amlignore").write_text("jobs/\n")
    assert main(argv) == 0
    assert capsys.readouterr().err == ""


def test_cli_options_may_follow_the_script_and_its_arguments_follow_double_dash(project, capsys):
    code = main(["submit", "--compute", "cpu", "train.py", "-ppn", "2", "--image", IMAGE, "--dry-run",
                 "--json", "--output-yaml", "out/job.yml", "--", "--set", "epochs=3", "--json"])

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["command"] == "python train.py --set epochs=3 --json"  # the script's own --json
    assert (result["nodes"], result["processes_per_node"], result["world_size"]) == (1, 2, 2)


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "0"], "hvdazure: error: --nodes must be at least 1, got 0"),
    (["--sdk", "v3"], "hvdazure: error: --sdk 'v3': expected v2"),
    (["--input", "data"], "hvdazure: error: --input expects KEY=VALUE, got 'data'"),
    (["--env", "HF_TOKEN=x"], "hvdazure: error: --env HF_TOKEN: looks like a credential"),
    (["--", "--set", "batch_size=0"], "hvdazure: error: the script's arguments: config field 'batch_size'"),
])
def test_cli_refuses_a_bad_job_in_one_line(project, capsys, argv, message):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run", *argv])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(message)
    assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "help_of"), [  # every subcommand: the parser is the CLI's one _Parser
    (["submit", "train.py", "--compute", "cpu", "--nodse", "2"], "hvdazure submit"),
    (["submit", "sweep", "train.py", "--compute", "cpu", "--space", "s", "--metric", "m", "--bogus"],
     "hvdazure submit sweep"),
    (["submit", "in-job-sweep", "train.py", "--compute", "cpu", "--space", "s", "--metric", "m", "--bogus"],
     "hvdazure submit in-job-sweep"),
    (["azure", "compute", "create", "c", "--vm-size", "S", "--max-nodes", "1", "--bogus"],
     "hvdazure azure compute create"),
    (["data", "index", "shards", "--bogus"], "hvdazure data index"),
    (["doctor", "--bogus"], "hvdazure doctor"),
    (["run", "-np", "2", "--bogus", "t.py"], "hvdazure run"),
    (["--bogus", "doctor"], "hvdazure"),
])
def test_an_unknown_option_points_to_the_help_of_the_command_that_refused_it(capsys, argv, help_of):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)

    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(f" (see {help_of} --help)\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "two"], "argument --nodes: invalid int value: 'two' (see hvdazure submit --help)"),
    (["--bogus"], "unrecognized arguments: --bogus (see hvdazure submit --help)"),
    (["--nodes", "0"], "--nodes must be at least 1, got 0"),
    (["--compute", "bad name!"], "--compute 'bad name!': 2 to 32 letters, digits and '-', starting with a "
                                 "letter (Azure ML's compute names)"),
])
def test_with_json_a_failure_is_json_on_stdout_and_one_line_on_stderr(project, capsys, argv, message):
    try:
        code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run",
                     "--json", *argv, "--", "--json"])
    except SystemExit as exit_info:
        code = exit_info.code

    printed = capsys.readouterr()
    assert code == 2
    assert json.loads(printed.out) == {"error": message, "exit_code": 2}
    assert printed.err == f"hvdazure: error: {message}\n"


def test_without_json_a_failure_prints_nothing_on_stdout(project, capsys):
    assert main(["submit", "train.py", "--compute", "bad name!", "-ppn", "1", "--image", IMAGE,
                 "--dry-run", "--", "--json"]) == 2
    assert capsys.readouterr().out == ""


def test_cli_create_compute_needs_a_vm_size_before_anything_else(project, capsys):
    code = main(["submit", "train.py", "--compute", "gpu-cluster", "-ppn", "1", "--image", IMAGE,
                 "--create-compute"])

    assert code == 2
    assert capsys.readouterr().err.startswith("hvdazure: error: --vm-size is required to create a compute")


def test_cli_submit_without_a_workspace_says_how_to_name_one(project, capsys):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE])

    assert code == 2
    assert capsys.readouterr().err.startswith("hvdazure: error: no Azure ML workspace given: pass "
                                              "--workspace-config config.json")


@pytest.mark.parametrize("argv", [["submit", "--help"], ["submit", "sweep", "--help"],
                                  ["submit", "in-job-sweep", "--help"],
                                  ["azure", "compute", "create", "--help"]])
def test_help_of_the_azure_commands_loads_no_azure_module(argv):
    probe = ("import runpy, sys, json\n"
             f"sys.argv = ['hvdazure', *{argv!r}]\n"
             "try:\n    runpy.run_module('hvdazure.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "azure = [m for m in sys.modules if m.split('.')[0] in ('azure', 'azureml')]\n"
             "print(json.dumps([code, sorted(azure)]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, []]
    assert "out of support since 2026-06-30" in proc.stdout or argv[0] == "azure"


def test_the_python_api_sample_dry_runs_the_digits_job(tmp_path):
    sample = Path(__file__).resolve().parents[3] / "samples" / "azure_submit.py"
    proc = subprocess.run([sys.executable, str(sample)], cwd=tmp_path, capture_output=True, text=True)

    assert proc.returncode == 0, proc.stderr
    assert "MPI layout: 2 node(s) x 1 process(es) = world size 2" in proc.stdout
    assert "command: python torch_digits.py --set epochs=15 --set lr=0.05" in proc.stdout
    assert (tmp_path / "azure-job" / "job.yml").is_file()
