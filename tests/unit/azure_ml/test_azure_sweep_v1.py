"""`hvdazure submit sweep ... --sdk v1`: a HyperDrive run (azureml-train-core), offline.

The HyperDriveConfig is built from the same resolved SweepJob as SDK v2's sweep job and serialised as its
service is sent it; a dry run loads it back; a submission goes through the `responses` recorder of
sdk_v1_fakes.py (plus the HyperDrive service) up to the POST that starts the run. Also here: the
trial's entry file, which turns HyperDrive's `--KEY VALUE` arguments into the script's `--set`, run for real
in a subprocess. No test here reaches Azure, and none shows that a HyperDrive run ran there.
"""

from __future__ import annotations

import email
import json
import re
import subprocess
import sys

import job_specs
import pytest
import yaml
from fakes.azureml_jobs import FakeCredential
from job_specs import IMAGE, sweep
from sdk_v1_fakes import FakeService, serving

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.hyperdrive_args import ENTRY_FILE, ENTRY_SOURCE, HyperDriveArgsError, translate
from hvdazure.azure.spec.job import JobSpec, resolve
from hvdazure.azure.v1 import sweep as sweep_v1
from hvdazure.azure.workspace import WorkspaceRef

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
SPACE = """\
lr: {type: loguniform, min_value: -9.2, max_value: -2.3}
batch_size: {type: choice, values: [16, 32, 64]}
extra.hidden: {type: choice, values: [32, 64]}
"""
ENTRY_ARGS = ["--param", "lr=lr", "--param", "batch_size=batch_size", "--param", "extra_hidden=extra.hidden",
              "--", "train.py", "--set", "epochs=3", "--set", "mlflow=true"]


pytestmark.append(pytest.mark.project(files={"space.yaml": SPACE}, v1=True))


def sweep_job(**options) -> JobSpec:
    """The sweep job of `options`: the job's own (name, description, max duration) and the sweep's."""
    job = {name: options.pop(name) for name in ("name", "description", "max_duration") if name in options}
    return job_specs.spec(script_args=["--set", "epochs=3"], sweep=sweep(**options), **job)


def hyperdrive(spec: JobSpec) -> sweep_v1.HyperDriveRun:
    """The form SDK v1's V1Sdk sends the resolved sweep job in."""
    job = resolve(spec)
    return sweep_v1.HyperDriveRun(job, job.kind)


# --- the HyperDriveConfig ---------------------------------------------------------------------------------
def test_the_hyperdrive_config_holds_sampling_metric_limits_and_policy_around_the_mpi_trial(project):
    config = hyperdrive(sweep_job(trials=20, max_concurrent_trials=4, seed=7, max_duration=7200,
                                  early_termination="bandit", slack_factor=0.2)).build_config()

    assert config._generator_config == {
        "name": "RANDOM", "properties": {"seed": 7},
        "parameter_space": {"--lr": ["loguniform", [-9.2, -2.3]], "--batch_size": ["choice", [[16, 32, 64]]],
                            "--extra_hidden": ["choice", [[32, 64]]]}}
    assert config._primary_metric_config == {"name": "eval_loss", "goal": "minimize"}
    assert (config._max_total_runs, config._max_concurrent_runs, config._max_duration_minutes) == (20, 4, 120)
    assert config._policy_config == {"name": "Bandit", "properties": {
        "evaluation_interval": 1, "delay_evaluation": 5, "slack_factor": 0.2}}
    trial = config.run_config  # run_config_v1's ScriptRunConfig of the command job, run by the entry
    assert (trial.script, list(trial.arguments)) == (ENTRY_FILE, ENTRY_ARGS)
    mpi = trial.run_config.mpi
    assert (mpi.process_count_per_node, mpi.node_count, trial.run_config.node_count) == (4, 2, 2)
    assert trial.run_config.environment.docker.base_image == IMAGE


@pytest.mark.parametrize(("options", "sampling", "policy"), [
    ({"sampler": "grid", "early_termination": "median"}, "GRID",
     {"name": "MedianStopping", "properties": {"evaluation_interval": 1, "delay_evaluation": 5}}),
    ({"sampler": "bayesian"}, "BayesianOptimization", {"name": "Default"}),
    ({"early_termination": "truncation", "truncation_percentage": 25, "delay_evaluation": 2}, "RANDOM",
     {"name": "TruncationSelection", "properties": {
         "evaluation_interval": 1, "delay_evaluation": 2, "truncation_percentage": 25,
         "exclude_finished_jobs": False}}),
])
def test_each_sampler_and_policy_becomes_hyperdrives_own(project, options, sampling, policy):
    (project / "space.yaml").write_text("batch_size: {type: choice, values: [16, 32]}\n"
                                        "epochs: {type: choice, values: [2, 4]}\n")
    config = hyperdrive(sweep_job(**options)).build_config()

    assert config._generator_config["name"] == sampling
    assert config._policy_config == policy
    assert config._max_duration_minutes == sweep_v1.MAX_DURATION_MINUTES  # no --max-duration: HyperDrive's


def test_v1_dry_run_writes_the_hyperdrive_settings_and_the_trial_and_loads_both_back(project, tmp_path):
    result = submission.dry_run(sweep_job(early_termination="median"), tmp_path / "run.yml", sdk="v1")

    written = yaml.safe_load((tmp_path / "run.yml").read_text())
    assert written["hyperdrive"]["primary_metric_config"] == {"goal": "minimize", "name": "eval_loss"}
    assert (written["hyperdrive"]["max_total_jobs"], written["hyperdrive"]["max_concurrent_jobs"]) == (10, 10)
    assert written["hyperdrive"]["policy_config"]["name"] == "MedianStopping"
    assert written["run_configuration"]["mpi"] == {"processCountPerNode": 4, "nodeCount": 2}
    assert written["run_configuration"]["arguments"] == ENTRY_ARGS
    assert result.body["hyperdrive"] == written["hyperdrive"]
    report = result.report()
    assert "command: python hvdazure_hyperdrive.py " + " ".join(ENTRY_ARGS) in report  # what v1 runs
    assert ("HyperDrive appends each sampled value to that command as --KEY VALUE, which "
            "hvdazure_hyperdrive.py hands train.py as --set NAME=VALUE") in report
    assert not [line for line in report if "search_space" in line]
    assert result.as_dict()["command"] == "python hvdazure_hyperdrive.py " + " ".join(ENTRY_ARGS)
    assert report[-2].endswith("and azureml-train-core the HyperDriveConfig")


def test_a_written_file_that_no_longer_says_the_same_fails_to_load_back(project, tmp_path):
    run = hyperdrive(sweep_job())
    (path,) = run.write_yaml(tmp_path / "run.yml")
    written = yaml.safe_load(path.read_text())
    written["hyperdrive"]["generator_config"]["name"] = "SOBOL"
    path.write_text(yaml.safe_dump(written))

    with pytest.raises(SubmitError, match=r"^azureml-train-core cannot load run\.yml back: ") as error:
        run.validate_offline([path])

    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("space", "options", "message"), [
    ("lr: {type: quniform, min_value: 0.1, max_value: 0.9, q: 0.1}\n", {},
     r"^search space parameter 'lr': quniform\(min_value=0\.1, max_value=0\.9, q=0\.1\): .*q.* \(HyperDrive, "
     r"SDK v1\)$"),
    ("lr: {type: quniform, min_value: 0.5, max_value: 10, q: 1}\n", {"sampler": "bayesian"},
     r"^azureml-train-core refused the sweep: Failed to validate a parameter distribution due to Expected "
     r"quniform arguments to be int\.$"),
    ("extra.flag: {type: choice, values: [true, false]}\n", {},
     r"^search space parameter 'extra\.flag': choice\[True, False\]: 'choice' values should be 'int', "
     r"'string' or 'float'\. \(HyperDrive, SDK v1\)$"),
    (SPACE, {"max_duration": 7 * 24 * 3600 + 1},
     r"^--max-duration 7d1s \(604801 s\): a HyperDrive run lasts at most 10080 minutes \(7d\)$"),
    (SPACE, {"max_duration": "169h"},
     r"^--max-duration 7d1h \(608400 s\): a HyperDrive run lasts at most 10080 minutes \(7d\)$"),
])
def test_what_hyperdrive_refuses_is_one_line_before_anything_is_written(project, tmp_path, space, options,
                                                                         message):
    (project / "space.yaml").write_text(space)
    with pytest.raises(JobSpecError, match=message):
        submission.dry_run(sweep_job(**options), tmp_path / "run.yml", sdk="v1")

    assert not (tmp_path / "run.yml").exists()


def test_an_entry_file_the_upload_would_leave_out_is_refused(project, tmp_path):
    (project / ".amlignore").write_text("hvdazure_*.py\n")

    with pytest.raises(JobSpecError, match=r"^hvdazure_hyperdrive\.py is excluded by .*\.amlignore, and an "
                                           r"SDK v1 sweep's trials run it from the upload: let it through"):
        submission.dry_run(sweep_job(), tmp_path / "run.yml", sdk="v1")


def test_a_file_of_the_entrys_name_that_is_not_it_is_refused(project, tmp_path):
    (project / ENTRY_FILE).write_text("print('mine')\n")

    with pytest.raises(JobSpecError, match=r"hvdazure_hyperdrive\.py is not hvdazure's HyperDrive entry"):
        submission.dry_run(sweep_job(), tmp_path / "run.yml", sdk="v1")


def test_the_entry_file_is_there_for_the_snapshot_only_and_one_of_the_user_stays(project):
    with sweep_v1.entry_file(project) as path:
        assert path.read_text() == ENTRY_SOURCE
    assert not path.exists()

    path.write_text(ENTRY_SOURCE)
    with sweep_v1.entry_file(project):
        pass
    assert path.read_text() == ENTRY_SOURCE


# --- submitted up to HTTP ---------------------------------------------------------------------------------
class HyperDriveService(FakeService):
    """sdk_v1_fakes.py's services, and HyperDrive's: its `runs` POST (a multipart form whose `config`
    part is the CreateExperimentDto as JSON) starts the sweep and names the parent run; `hdruns/RUN_ID`
    does so under the custom run id RUN_ID."""

    def __init__(self) -> None:
        super().__init__()
        self.experiments: list[dict] = []

    def __call__(self, request):
        url = request.url.split("?")[0]
        if "/hyperdrive/v1.0/" not in url:
            return super().__call__(request)
        self.calls.append((request.method, url, None))
        form = email.message_from_bytes(f"Content-Type: {request.headers['Content-Type']}\r\n\r\n".encode()
                                        + request.body)
        (config,) = [part for part in form.walk() if part.get_param("name", header="Content-Disposition")
                     == "config"]
        self.experiments.append(json.loads(config.get_payload(decode=True)))
        custom = re.search(r"/hdruns/([^/]+)$", url)
        parent = custom.group(1) if custom else "HD_1234"
        answer = {"code": 201, "result": {"name": "project", "platform_config": {"ParentRunId": parent}}}
        return 201, {}, json.dumps(answer)


@pytest.fixture
def service():
    fake = HyperDriveService()
    with serving(fake):
        yield fake


def test_a_v1_sweep_uploads_the_code_with_the_entry_file_then_starts_a_hyperdrive_run(project, service):
    job = sweep_job(trials=8, max_concurrent_trials=2, early_termination="median")
    workspace = WorkspaceRef("sub-id", "rg", "ws")
    submitted = submission.submit(job, workspace, sdk="v1", credential=FakeCredential())

    uploaded = {u.rsplit("/", 1)[1] for m, u, _ in service.calls if m == "PUT" and "blob.core" in u}
    assert uploaded == {"train.py", "space.yaml", ENTRY_FILE}
    assert not (project / ENTRY_FILE).exists()  # written for the snapshot only
    kinds = service.kinds()
    assert kinds.index("PUT blob") < next(i for i, k in enumerate(kinds) if "/hyperdrive/" in k)
    (experiment,) = service.experiments
    assert experiment["generator_config"]["parameter_space"]["--extra_hidden"] == ["choice", [[32, 64]]]
    assert experiment["primary_metric_config"] == {"goal": "minimize", "name": "eval_loss"}
    assert (experiment["max_total_jobs"], experiment["max_concurrent_jobs"]) == (8, 2)
    assert experiment["policy_config"]["name"] == "MedianStopping"
    trial = experiment["platform_config"]["Definition"]["Overrides"]
    assert trial["mpi"] == {"processCountPerNode": 4, "nodeCount": 2}
    assert (trial["script"], trial["arguments"]) == (ENTRY_FILE, ENTRY_ARGS)
    assert experiment["platform_config"]["Definition"]["SnapshotId"]
    assert (submitted.name, submitted.sdk) == ("HD_1234", "v1")


# --- the trial's entry: HyperDrive's arguments as --set -----------------------------------------------------
def test_hyperdrives_trailing_arguments_become_set_after_the_scripts_own():
    argv = ["--param", "lr=lr", "--param", "extra_hidden=extra.hidden", "--", "train.py", "--set", "epochs=3",
            "--lr", "0.05", "--extra_hidden=64"]

    assert translate(argv) == ["train.py", "--set", "epochs=3", "--set", "lr=0.05",
                               "--set", "extra.hidden=64"]


def test_only_the_trailing_pairs_are_hyperdrives_the_scripts_own_look_alikes_stay():
    argv = ["--param", "lr=lr", "--", "train.py", "--lr", "kept", "--set", "epochs=3", "--lr", "-0.5"]

    assert translate(argv) == ["train.py", "--lr", "kept", "--set", "epochs=3", "--set", "lr=-0.5"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--param", "lr=lr", "--", "train.py"], "HyperDrive passed no value for --lr"),
    (["--param", "lr", "--", "train.py", "--lr", "1"], "--param expects KEY=NAME, got 'lr'"),
    (["--param", "lr=lr", "train.py"], "expected --param KEY=NAME ... -- SCRIPT [ARGS]"),
    (["--param", "lr=lr", "--"], "no script after --"),
])
def test_arguments_the_entry_cannot_use_are_one_line(argv, message):
    with pytest.raises(HyperDriveArgsError, match=f"^{re.escape(message)}$"):
        translate(argv)


def test_the_entry_file_runs_the_script_with_its_own_modules_and_the_sampled_values(tmp_path):
    (tmp_path / ENTRY_FILE).write_text(ENTRY_SOURCE)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helper.py").write_text("NAME = 'helper'\n")
    (tmp_path / "pkg" / "train.py").write_text(
        "import json\nfrom helper import NAME\nfrom hvdazure.core.config import TrainConfig\n"
        "config = TrainConfig.from_cli()\n"
        "print(json.dumps([__name__, NAME, config.lr, config.epochs, config.extra]))\n")
    argv = ["--param", "lr=lr", "--param", "extra_hidden=extra.hidden", "--", "pkg/train.py", "--set",
            "epochs=2", "--lr", "0.05", "--extra_hidden", "64"]  # as HyperDrive appends its values

    proc = subprocess.run([sys.executable, ENTRY_FILE, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["__main__", "helper", 0.05, 2, {"hidden": 64}]


def test_the_entry_exits_2_with_one_line_when_hyperdrive_passed_no_value(tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")

    proc = subprocess.run([sys.executable, "-m", "hvdazure.azure.hyperdrive_args", "--param", "lr=lr", "--",
                           "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert (proc.returncode, proc.stderr) == (2, "hvdazure: error: HyperDrive passed no value for --lr\n")


def test_a_trial_timeout_is_each_hyperdrive_trials_max_run_duration(project, tmp_path):
    config = hyperdrive(sweep_job(trial_timeout=5400)).build_config()
    submission.dry_run(sweep_job(trial_timeout=5400), tmp_path / "run.yml", sdk="v1")

    assert config.run_config.run_config.max_run_duration_seconds == 5400
    written = yaml.safe_load((tmp_path / "run.yml").read_text())
    assert written["run_configuration"]["maxRunDurationSeconds"] == 5400


def test_a_v1_in_job_sweep_submits_a_run_whose_command_is_the_sweep(project, service):
    from hvdazure.azure.spec.sweep import InJobSweepSpec

    job = JobSpec(script="train.py", compute="gpu-cluster", nodes=2, image=IMAGE,
                  script_args=["--set", "epochs=3"],
                  sweep=InJobSweepSpec("space.yaml", "eval_loss", ranks_per_trial=4))
    submission.submit(job, WorkspaceRef("sub-id", "rg", "ws"), sdk="v1", credential=FakeCredential())

    configuration = service.snapshot_run()["Configuration"]
    assert configuration["mpi"] == {"processCountPerNode": 8, "nodeCount": 2}  # ND96asr_v4: 8 GPUs
    assert configuration["command"] == (
        "python -m hvdazure.sweep train.py --space space.yaml --trials 10 --ranks-per-trial 4 --metric "
        "eval_loss --mode min --sampler tpe --pruner none --seed 0 --output ./outputs/sweep --mlflow -- "
        "--set epochs=3")
    assert (configuration["script"], configuration["arguments"]) == (None, [])


def test_a_submitted_hyperdrive_run_is_named_described_and_bounded_as_asked(project, service):
    workspace = WorkspaceRef("sub-id", "rg", "ws")
    submitted = submission.submit(sweep_job(name="digits-sweep", description="lr sweep", max_duration=7200),
                                  workspace, sdk="v1", credential=FakeCredential())

    (started,) = [u for m, u, _ in service.calls if "/hyperdrive/v1.0/" in u]
    assert started.endswith("/hdruns/digits-sweep")  # HyperDrive's custom run id
    assert submitted.name == "digits-sweep"
    (experiment,) = service.experiments
    assert experiment["max_duration_minutes"] == 120
    patches = [json.loads(body) for method, url, body in service.calls
               if method == "PATCH" and url.endswith("/runs/digits-sweep")]
    assert {"runId": "digits-sweep", "description": "lr sweep"} in patches


def test_a_submitted_hyperdrive_run_gives_each_trial_the_trial_timeout(project, service):
    workspace = WorkspaceRef("sub-id", "rg", "ws")
    submission.submit(sweep_job(trial_timeout=5400), workspace, sdk="v1", credential=FakeCredential())

    (experiment,) = service.experiments
    assert experiment["platform_config"]["Definition"]["Overrides"]["maxRunDurationSeconds"] == 5400
