"""`hvdazure submit sweep` (an Azure ML sweep job, SDK v2) and `submit in-job-sweep` (one MPI command job
running `python -m hvdazure.sweep`), checked offline: the YAML loads with azure-ai-ml's `load_job` and turns
into the REST body the service would receive; bad spaces and options fail in one line before anything is
written, and options that do not go with the job asked for are refused by the CLI's parser; a submission
goes through the recording transport of sdk_v2_fakes.py up to the job PUT. No test here reaches
Azure, and none shows that a sweep ran there.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from functools import partial

import job_specs
import pytest
import yaml
from job_specs import IMAGE, in_job, rest_body, sweep
from sdk_v2_fakes import WORKSPACE, FakeCredential, FakeWorkspace, RecordingTransport

from hvdazure.azure import submission
from hvdazure.azure.compute import ClusterSpec
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import OutputSpec, resolve
from hvdazure.azure.v2 import submit as submit_v2
from hvdazure.cli import main
from hvdazure.core.config import TrainConfig

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
SPACE = """\
lr: {type: loguniform, min_value: -9.2, max_value: -2.3}
batch_size: {type: choice, values: [16, 32, 64]}
extra.hidden: {type: choice, values: [32, 64, 128]}
"""


pytestmark.append(pytest.mark.project(files={"space.yaml": SPACE}))


spec = partial(job_specs.spec, script_args=["--set", "epochs=3"], sweep=sweep())


# --- the sweep job's YAML -----------------------------------------------------------------------------------
def test_the_sweep_yaml_loads_with_load_job_into_a_sweep_job_whose_trial_is_the_mpi_job(project, tmp_path):
    from azure.ai.ml.sweep import SweepJob

    job = spec(sweep=sweep(trials=20, max_concurrent_trials=4, early_termination="bandit", seed=7),
               max_duration=7200, shm_size="16g")
    result = submission.dry_run(job, tmp_path / "out" / "sweep.yml")

    loaded, body = rest_body(tmp_path / "out" / "sweep.yml")  # afresh, as `az ml job create -f` would
    assert isinstance(loaded, SweepJob)
    trial = loaded.trial
    assert (trial.resources.instance_count, trial.distribution.process_count_per_instance) == (2, 4)
    assert body["jobType"] == "Sweep"
    assert body["trial"]["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 4}
    assert body["trial"]["resources"]["instanceCount"] == 2
    assert body["trial"]["resources"]["shmSize"] == "16g"
    assert body["objective"] == {"goal": "minimize", "primaryMetric": "eval_loss"}
    assert body["limits"] == {"maxTotalTrials": 20, "maxConcurrentTrials": 4, "timeout": "PT2H",
                              "jobLimitsType": "Sweep"}
    assert body["samplingAlgorithm"] == {"samplingAlgorithmType": "Random", "seed": 7}
    assert body["earlyTermination"] == {"policyType": "Bandit", "evaluationInterval": 1, "delayEvaluation": 5,
                                        "slackFactor": 0.1, "slackAmount": 0.0}
    assert (body["computeId"], body["experimentName"]) == ("gpu-cluster", "project")
    assert body == result.body


def test_the_sweep_yaml_is_az_ml_job_create_format_with_the_trial_code_relative_to_it(project, tmp_path):
    submission.dry_run(spec(), tmp_path / "out" / "sweep.yml")

    written = yaml.safe_load((tmp_path / "out" / "sweep.yml").read_text())
    assert written["$schema"].endswith("/sweepJob.schema.json")
    assert (written["type"], written["trial"]["code"]) == ("sweep", "../project")
    assert list(written)[:6] == ["$schema", "type", "display_name", "experiment_name", "compute", "trial"]


def test_each_sampled_value_reaches_the_script_as_set_under_an_identifier_key(project, tmp_path):
    result = submission.dry_run(spec(), tmp_path / "sweep.yml")

    assert set(result.body["searchSpace"]) == {"lr", "batch_size", "extra_hidden"}
    assert result.body["searchSpace"]["extra_hidden"] == ["choice", [[32, 64, 128]]]
    assert result.body["trial"]["command"] == (
        "python train.py --set epochs=3 --set mlflow=true --set 'lr=${{search_space.lr}}' "
        "--set 'batch_size=${{search_space.batch_size}}' --set 'extra.hidden=${{search_space.extra_hidden}}'")


def test_the_trial_command_with_values_in_place_of_its_placeholders_parses_as_the_script_will(project,
                                                                                               tmp_path):
    result = submission.dry_run(spec(), tmp_path / "sweep.yml")
    command = result.body["trial"]["command"]
    sampled = {"lr": "0.0123", "batch_size": "32", "extra_hidden": "64"}  # as Azure ML writes them per trial

    filled = re.sub(r"\$\{\{search_space\.(\w+)\}\}", lambda m: sampled[m.group(1)], command)
    config = TrainConfig._from_cli(shlex.split(filled)[2:], {})

    assert (config.lr, config.batch_size, config.extra, config.epochs, config.mlflow) == (
        0.0123, 32, {"hidden": 64}, 3, True)


def test_a_search_space_placeholder_the_space_lacks_is_caught_offline(project, tmp_path):
    job = resolve(spec())
    undefined = ("--set", "extra.x=${{search_space.nope}}")
    job = dataclasses.replace(job, script_args=(*job.script_args, *undefined))
    api = submit_v2.V2Sdk()
    files = api.write_yaml(job, tmp_path / "sweep.yml")

    with pytest.raises(SubmitError, match=r"search_space\.nope\}\}, which the search space does not define$"):
        api.validate_offline(job, files)


def test_every_distribution_maps_to_azure_mls_own(project, tmp_path):
    (project / "space.yaml").write_text("""\
extra.a: {type: choice, values: [1, 2]}
extra.b: {type: randint, upper: 5}
extra.c: {type: uniform, min_value: 0, max_value: 1}
extra.d: {type: quniform, min_value: 0, max_value: 10, q: 2}
extra.e: {type: loguniform, min_value: -3, max_value: 0}
extra.f: {type: qloguniform, min_value: 0, max_value: 3, q: 1}
extra.g: {type: normal, mu: 0, sigma: 1}
extra.h: {type: qnormal, mu: 0, sigma: 1, q: 0.5}
extra.i: {type: lognormal, mu: 0, sigma: 1}
extra.j: {type: qlognormal, sigma: 1, mu: 0, q: 1}
""")
    result = submission.dry_run(spec(), tmp_path / "sweep.yml")

    assert result.body["searchSpace"] == {
        "extra_a": ["choice", [[1, 2]]], "extra_b": ["randint", [5]], "extra_c": ["uniform", [0, 1]],
        "extra_d": ["quniform", [0, 10, 2]], "extra_e": ["loguniform", [-3, 0]],
        "extra_f": ["qloguniform", [0, 3, 1]], "extra_g": ["normal", [0, 1]],
        "extra_h": ["qnormal", [0, 1, 0.5]], "extra_i": ["lognormal", [0, 1]],
        "extra_j": ["qlognormal", [0, 1, 1]]}  # in Azure ML's order, whatever the file's


@pytest.mark.parametrize(("policy", "options", "expected"), [
    ("median", {}, {"policyType": "MedianStopping", "evaluationInterval": 1, "delayEvaluation": 5}),
    ("truncation", {"truncation_percentage": 30, "evaluation_interval": 2, "delay_evaluation": 0},
     {"policyType": "TruncationSelection", "evaluationInterval": 2, "delayEvaluation": 0,
      "truncationPercentage": 30}),
    ("bandit", {"slack_factor": 0.2}, {"policyType": "Bandit", "evaluationInterval": 1, "delayEvaluation": 5,
                                       "slackFactor": 0.2, "slackAmount": 0.0}),
])
def test_early_termination_policies_reach_the_rest_body(project, tmp_path, policy, options, expected):
    job = spec(sweep=sweep(early_termination=policy, **options))
    result = submission.dry_run(job, tmp_path / "sweep.yml")

    assert {k: v for k, v in result.body["earlyTermination"].items() if v is not None} == expected


def test_no_early_termination_by_default(project, tmp_path):
    result = submission.dry_run(spec(), tmp_path / "sweep.yml")

    assert result.body.get("earlyTermination") is None
    assert result.body["limits"]["maxConcurrentTrials"] == result.body["limits"]["maxTotalTrials"] == 10


def test_grid_sampling_over_choices_and_bayesian_over_choice_uniform_quniform(project, tmp_path):
    (project / "grid.yaml").write_text("batch_size: {type: choice, values: [16, 32]}\n")
    (project / "bayes.yaml").write_text("lr: {type: uniform, min_value: 0.001, max_value: 0.1}\n"
                                        "epochs: {type: quniform, min_value: 2, max_value: 10, q: 2}\n"
                                        "batch_size: {type: choice, values: [16, 32]}\n")
    grid = submission.dry_run(spec(sweep=sweep(space="grid.yaml", sampler="grid")), tmp_path / "grid.yml")
    bayes = submission.dry_run(spec(sweep=sweep(space="bayes.yaml", sampler="bayesian")), tmp_path / "b.yml")

    assert grid.body["samplingAlgorithm"] == {"samplingAlgorithmType": "Grid"}
    assert bayes.body["samplingAlgorithm"] == {"samplingAlgorithmType": "Bayesian"}


def test_the_python_api_takes_the_same_sweep(project, tmp_path):
    from hvdazure.azure import EarlyTermination, SweepSpec

    job = spec(sweep=SweepSpec("space.yaml", "eval_accuracy", mode="max", trials=6,
                               early_termination=EarlyTermination("bandit")))
    result = submission.dry_run(job, tmp_path / "sweep.yml")

    assert result.body["objective"] == {"goal": "maximize", "primaryMetric": "eval_accuracy"}
    assert result.body["earlyTermination"]["slackFactor"] == 0.1  # bandit's default, as on the command line


# --- what is refused, in one line, before anything is written --------------------------------------------
@pytest.mark.parametrize(("space", "options", "message"), [
    (SPACE, {"sampler": "grid"},
     r"^--sampler grid: Azure ML's grid sampling takes choice parameters only, and 'lr' is loguniform"),
    ("batch_size: {type: randint, upper: 4}\n", {"sampler": "grid"},
     r"^--sampler grid: .* 'batch_size' is randint\(upper=4\)$"),
    (SPACE, {"sampler": "bayesian"},
     r"^--sampler bayesian: Azure ML's bayesian sampling takes choice, uniform, quniform parameters only, "
     r"and 'lr' is loguniform\(min_value=-9\.2, max_value=-2\.3\)$"),
    ("batch_size: {type: choice, values: [16, 32]}\n", {"sampler": "bayesian", "early_termination": "median"},
     r"^--early-termination median: Azure ML's Bayesian sampling takes no early termination policy"),
    ("extra.a-b: {type: choice, values: [1]}\nextra.a_b: {type: choice, values: [2]}\n", {},
     r"^search space parameters 'extra\.a-b' and 'extra\.a_b' both become the Azure ML search space key "
     r"'extra_a_b'"),
    ("lr: {type: loguniform, min_value: 1}\n", {}, r"^search space parameter 'lr': loguniform takes "),
    ("hidden: {type: choice, values: [1]}\n", {},
     r"^search space parameter 'hidden': is not a TrainConfig field"),
    (SPACE, {"trials": 0}, r"^--trials must be at least 1, got 0$"),
    (SPACE, {"trials": 4, "max_concurrent_trials": 8},
     r"^--max-concurrent-trials 8 is more than --trials 4$"),
    (SPACE, {"mode": "avg"}, r"^--mode 'avg': expected min or max$"),
    (SPACE, {"sampler": "tpe"},
     r"^--sampler 'tpe': Azure ML sweep jobs sample random, grid, bayesian \(tpe is"),
    (SPACE, {"seed": 1, "sampler": "bayesian"}, r"^--seed goes with --sampler random"),
    (SPACE, {"early_termination": "hyperband"}, r"^--early-termination 'hyperband': expected none, bandit, "),
    (SPACE, {"early_termination": "bandit", "slack_factor": 0.0},
     r"^--slack-factor must be a number above 0"),
    (SPACE, {"early_termination": "truncation", "truncation_percentage": 100},
     r"^--truncation-percentage must be 1 to 99, got 100$"),
    (SPACE, {"early_termination": "median", "evaluation_interval": 0},
     r"^--evaluation-interval must be at least 1, got 0$"),
    (SPACE, {"early_termination": "median", "delay_evaluation": -1},
     r"^--delay-evaluation must be at least 0"),
])
def test_a_bad_space_or_option_is_one_line_before_anything_is_written(project, tmp_path, space, options,
                                                                       message):
    (project / "space.yaml").write_text(space)
    with pytest.raises(JobSpecError, match=message) as error:
        submission.dry_run(spec(sweep=sweep(**options)), tmp_path / "sweep.yml")

    assert "\n" not in str(error.value)
    assert not (tmp_path / "sweep.yml").exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"evaluation_interval": 2},
     "--evaluation-interval goes with --early-termination bandit, median or truncation"),
    ({"early_termination": "median", "slack_factor": 0.1},
     "--slack-factor goes with --early-termination bandit, not median"),
])
def test_policy_options_that_do_not_go_with_the_policy_are_refused(options, message):
    with pytest.raises(JobSpecError) as error:
        sweep(**options)

    assert str(error.value).startswith(message)


def test_a_tracking_uri_of_the_scripts_own_is_refused_azure_would_never_see_the_metric(project, tmp_path):
    job = spec(script_args=["--set", "mlflow_tracking_uri=sqlite:///x.db"])

    with pytest.raises(JobSpecError, match=r"^the script's arguments set mlflow_tracking_uri, so trials "):
        submission.dry_run(job, tmp_path / "sweep.yml")


def test_a_metric_the_trainer_does_not_log_is_warned_about(project, tmp_path):
    warnings: list[str] = []
    submission.dry_run(spec(sweep=sweep(metric="loss")), tmp_path / "sweep.yml", warn=warnings.append)

    assert warnings == ["--metric loss: hvdazure's trainer logs eval_NAME and train_NAME to MLflow (e.g. "
                        "eval_loss); no trial reports this one unless the script logs it itself"]


def test_an_output_with_a_fixed_uri_is_shared_by_every_trial_and_said_so(project, tmp_path):
    warnings: list[str] = []
    job = spec(outputs=[OutputSpec("ckpt", "azureml://datastores/blob/paths/ckpt/")],
               script_args=["--set", "checkpoint_dir=${{outputs.ckpt}}"])
    result = submission.dry_run(job, tmp_path / "sweep.yml", warn=warnings.append)

    assert warnings == ["--output ckpt has a fixed URI: every trial of the sweep writes to "
                        "azureml://datastores/blob/paths/ckpt/"]
    assert result.body["outputs"]["ckpt"]["mode"] == "ReadWriteMount"  # the sweep job's, shared by the trials


# --- in-job sweep -----------------------------------------------------------------------------------------
def test_an_in_job_sweep_is_one_mpi_job_whose_ranks_run_the_sweep_entry_point(project, tmp_path):
    job = spec(sweep=in_job(trials=24, ranks_per_trial=4, pruner="median", seed=3))
    result = submission.dry_run(job, tmp_path / "job.yml")

    _, body = rest_body(tmp_path / "job.yml")
    assert body["jobType"] == "Command"
    assert body["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 4}
    assert body["resources"]["instanceCount"] == 2
    assert body["command"] == ("python -m hvdazure.sweep train.py --space space.yaml --trials 24 "
                               "--ranks-per-trial 4 --metric eval_loss --mode min --sampler tpe "
                               "--pruner median --seed 3 --output ./outputs/sweep --mlflow -- --set epochs=3")
    assert "in-job sweep: 24 trial(s) of 4 rank(s), 2 at once on the job's 8 ranks; tpe sampler, pruner " \
           "median, seed 3; objective: minimize eval_loss; results in ./outputs/sweep" in result.report()


def test_the_in_job_command_parses_with_the_sweep_entry_points_own_parser(project, monkeypatch):
    from hvdazure.sweep.__main__ import main as rank_main

    job = resolve(spec(sweep=in_job(ranks_per_trial=2, sampler="random")))
    seen = []
    monkeypatch.setattr("hvdazure.sweep.worker.main", lambda options: seen.append(options) or 0)

    assert job.argv[:3] == ("python", "-m", "hvdazure.sweep")
    assert rank_main(list(job.argv[3:])) == 0  # what `python -m hvdazure.sweep` parses on every rank

    (options,) = seen
    assert (options.script, options.space, options.ranks_per_trial, options.sampler, options.output) == (
        "train.py", "space.yaml", 2, "random", "./outputs/sweep")
    assert options.script_args == ("--set", "epochs=3")


def test_ranks_per_trial_must_divide_nodes_times_processes(project, tmp_path):
    with pytest.raises(JobSpecError) as error:
        submission.dry_run(spec(sweep=in_job(ranks_per_trial=3)), tmp_path / "job.yml")

    assert str(error.value) == ("--ranks-per-trial 3 does not divide the job's 2 node(s) x 4 process(es) = 8 "
                                "ranks: every rank must belong to a trial")


@pytest.mark.parametrize(("setup", "overrides", "message"), [
    (lambda p: (p.parent / "outside.yaml").write_text(SPACE), {"space": "../outside.yaml"},
     r"^--space \.\./outside\.yaml is outside the code directory .*: the job reads it from the "),
    (lambda p: (p / ".amlignore").write_text("*.yaml\n"), {},
     r"^--space space\.yaml is excluded by .*\.amlignore: it would not be uploaded$"),
    (lambda p: None, {"space": "nope.yaml"},
     r"^--space nope\.yaml: search space file not found$"),
    (lambda p: None, {"sampler": "bayesian"},
     r"^--sampler must be one of tpe, random, grid, got 'bayesian'$"),
    (lambda p: (p / "space.yaml").write_text("lr: {type: normal, mu: 0, sigma: 1}\n"), {},
     r"^search space parameter 'lr': normal\(mu=0, sigma=1\) is not available in a local sweep"),
    (lambda p: None, {"ranks_per_trial": 0}, r"^--ranks-per-trial must be at least 1, got 0$"),
])
def test_an_in_job_sweep_the_job_could_not_run_is_refused_in_one_line(project, tmp_path, setup, overrides,
                                                                       message):
    setup(project)
    with pytest.raises(JobSpecError, match=message):
        submission.dry_run(spec(sweep=in_job(**overrides)), tmp_path / "job.yml")


def test_an_in_job_sweep_with_sdk_v1_is_a_run_of_the_same_command(project, tmp_path):
    job = spec(sweep=in_job(ranks_per_trial=2))
    v2 = submission.dry_run(job, tmp_path / "job.yml")
    v1 = submission.dry_run(job, tmp_path / "run.yml", sdk="v1")  # ScriptRunConfig(command=...)

    written = yaml.safe_load((tmp_path / "run.yml").read_text())
    assert written["command"] == shlex.join(v2.job.argv)  # quoted: azureml-core would join a list unquoted
    assert (written["script"], written["arguments"]) == (None, [])
    assert written["mpi"] == {"processCountPerNode": 4, "nodeCount": 2}
    assert v1.as_dict()["command"] == v2.as_dict()["command"] == shlex.join(v2.job.argv)


# --- submitted up to HTTP ---------------------------------------------------------------------------------
def submit(fake: FakeWorkspace, **overrides):
    job = spec(processes_per_node=None, **overrides)  # from the compute's VM size, as Azure reports it
    return submission.submit(job, WORKSPACE, credential=FakeCredential(),
                             client_options={"transport": RecordingTransport(fake)})


def test_a_submitted_sweep_puts_a_sweep_job_after_the_same_lookups_and_upload_as_a_command_job(project, fake):
    submitted = submit(fake, sweep=sweep(trials=12, max_concurrent_trials=3, early_termination="median"))

    version = next(p for m, p, _ in fake.calls if m == "PUT" and "/environments/" in p).rsplit("/", 1)[1]
    assert fake.arm_calls() == [
        ("GET", "/computes/gpu-cluster"),
        ("GET", f"/environments/hvdazure-gpu/versions/{version}"),
        ("PUT", f"/environments/hvdazure-gpu/versions/{version}"),
        ("GET", "/codes/*/versions"),
        ("POST", "/codes/*/versions/1/startPendingUpload"),
        ("PUT", "/codes/*/versions/1"),
        ("PUT", "/jobs/*"),
    ]
    assert any(m == "PUT" and p == "blob:project/space.yaml" for m, p, _ in fake.calls)
    body = fake.job_put()
    assert body["jobType"] == "Sweep"
    # the compute's VM size (ND96asr v4: 8 GPUs) gives each trial's processes per node, as for a command job
    assert body["trial"]["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 8}
    assert body["trial"]["resources"]["instanceCount"] == 2
    assert re.fullmatch(r".*/codes/[^/]+/versions/1", body["trial"]["codeId"])
    assert body["trial"]["environmentVariables"]["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    assert body["objective"] == {"goal": "minimize", "primaryMetric": "eval_loss"}
    assert (body["limits"]["maxTotalTrials"], body["limits"]["maxConcurrentTrials"]) == (12, 3)
    assert body["earlyTermination"]["policyType"] == "MedianStopping"
    assert set(body["searchSpace"]) == {"lr", "batch_size", "extra_hidden"}
    assert submitted.name == fake.calls[-1][1].rsplit("/", 1)[1]


def test_a_submitted_sweep_job_puts_its_name_description_timeout_and_queue_settings(project, fake):
    submitted = submit(fake, compute="serverless", vm_size="Standard_NC24ads_A100_v4", name="digits-sweep",
                       description="lr and batch size", max_duration=7200, job_tier="spot", priority="low")

    assert [p for m, p, _ in fake.calls if m == "PUT" and p.startswith("/jobs/")] == ["/jobs/digits-sweep"]
    assert submitted.name == "digits-sweep"
    body = fake.job_put()
    assert (body["jobType"], body["description"]) == ("Sweep", "lr and batch size")
    assert body["limits"]["timeout"] == "PT2H"  # the whole sweep job's
    assert body["queueSettings"] == {"jobTier": "Spot", "priority": 1}
    assert "computeId" not in body  # serverless compute
    assert body["trial"]["resources"]["instanceType"] == "Standard_NC24ads_A100_v4"


def test_a_submitted_in_job_sweep_checks_its_ranks_against_the_computes_size(project, fake):
    submit(fake, nodes=1, sweep=in_job(ranks_per_trial=8))  # 8 GPUs on the compute: known only from Azure

    body = fake.job_put()
    assert body["jobType"] == "Command"
    assert body["command"].startswith("python -m hvdazure.sweep train.py --space space.yaml --trials 10 "
                                      "--ranks-per-trial 8 ")
    assert body["distribution"]["processCountPerInstance"] == 8


def test_in_job_ranks_that_do_not_divide_the_computes_gpus_stop_before_the_upload(project, fake):
    with pytest.raises(JobSpecError, match=r"^--ranks-per-trial 3 does not divide the job's 2 node\(s\) x 8"):
        submit(fake, sweep=in_job(ranks_per_trial=3))

    assert not [p for _, p, _ in fake.calls if p.startswith(("blob:", "/codes/", "/jobs/"))]


# --- the CLI ----------------------------------------------------------------------------------------------
JOB = ["train.py", "--compute", "gpu-cluster", "--nodes", "2", "-ppn", "4", "--image", IMAGE, "--dry-run"]


def test_cli_dry_run_of_a_sweep_prints_the_trials_objective_policy_and_space(project, capsys):
    code = main(["submit", "sweep", *JOB, "--space", "space.yaml", "--metric", "eval_loss", "--trials", "20",
                 "--max-concurrent-trials", "4", "--early-termination", "bandit", "--", "--set", "epochs=3"])

    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert ("sweep job: 20 trial(s) of 2 node(s) x 4 process(es), up to 4 at once; random sampling; "
            "objective: minimize eval_loss (the MLflow metric every trial logs)") in out
    assert ("early termination: bandit (every 1 report(s) of the metric after the first 5, slack factor 0.1)"
            in out)
    assert ("search space (space.yaml): lr loguniform(min_value=-9.2, max_value=-2.3); batch_size "
            "choice[16, 32, 64]; extra.hidden choice[32, 64, 128] as extra_hidden") in out
    written = project.parent / "cache" / "hvdazure" / "dry-run" / "project"
    assert out[-1] == (f"to submit: az ml environment create -f {written}/hvdazure-job.environment.yml && "
                       f"az ml job create -f {written}/hvdazure-job.yml")


def test_cli_json_says_what_the_sweep_searches(project, capsys):
    code = main(["submit", "in-job-sweep", *JOB, "--json", "--space", "space.yaml", "--metric", "eval_loss",
                 "--ranks-per-trial", "2"])

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["sweep"]["type"] == "in_job"
    assert (result["sweep"]["ranks_per_trial"], result["sweep"]["output"]) == (2, "./outputs/sweep")


def test_cli_plain_submit_is_a_command_job(project, capsys):
    assert main(["submit", *JOB, "--json"]) == 0

    assert "sweep" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("argv", "message"), [
    (["in-job-sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--ranks-per-trial", "3"],
     "hvdazure: error: --ranks-per-trial 3 does not divide the job's 2 node(s) x 4 process(es) = 8 ranks"),
    (["sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--early-termination", "median",
      "--slack-factor", "0.2"],
     "hvdazure: error: --slack-factor goes with --early-termination bandit, not median"),
    (["sweep", *JOB, "--space", "nope.yaml", "--metric", "m"],
     "hvdazure: error: --space nope.yaml: search space file not found"),
])
def test_cli_refuses_a_bad_sweep_in_one_line_with_status_2_and_writes_nothing(project, capsys, argv, message):
    code = main(["submit", *argv])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(message)
    assert err.count("\n") == 1
    assert not (project / "hvdazure-job.yml").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["sweep", *JOB, "--space", "space.yaml"], "the following arguments are required: --metric"),
    (["sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--sampler", "hyperopt"],
     "argument --sampler: invalid choice: 'hyperopt'"),
    (["sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--early-termination", "asha"],
     "argument --early-termination: invalid choice: 'asha'"),
    (["sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--ranks-per-trial", "2"],
     "unrecognized arguments: --ranks-per-trial 2"),
    (["in-job-sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--pruner", "asha"],
     "argument --pruner: invalid choice: 'asha'"),
    (["in-job-sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--early-termination", "bandit"],
     "unrecognized arguments: --early-termination bandit"),
    (["in-job-sweep", *JOB, "--space", "space.yaml", "--metric", "m", "--sampler", "bayesian"],
     "argument --sampler: invalid choice: 'bayesian'"),
    ([*JOB, "--trials", "5"], "unrecognized arguments: --trials 5"),
    ([*JOB, "--sweep", "space.yaml"], "unrecognized arguments: --sweep space.yaml"),  # the old spellings
    ([*JOB, "--in-job-sweep", "space.yaml"], "unrecognized arguments: --in-job-sweep space.yaml"),
    ([*JOB, "--metric", "eval_loss"], "unrecognized arguments: --metric eval_loss"),
])
def test_cli_refuses_options_that_do_not_go_with_the_job_before_anything_is_written(project, capsys, argv,
                                                                                      message):
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", *argv])

    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (project / "hvdazure-job.yml").exists()


# --- limits, cluster size and overridden arguments ----------------------------------------------------------
def test_a_trial_timeout_reaches_the_sweep_jobs_limits(project, tmp_path):
    result = submission.dry_run(spec(sweep=sweep(trial_timeout=5400), max_duration=36000),
                                tmp_path / "job.yml")

    _, body = rest_body(tmp_path / "job.yml")
    assert (body["limits"]["trialTimeout"], body["limits"]["timeout"]) == ("PT1H30M", "PT10H")
    assert "early termination: none; each trial stops after 1h30m (5400 s)" in result.report()
    assert "max duration: 10h (36000 s), then Azure ML cancels the job" in result.report()
    assert result.as_dict()["sweep"]["trial_timeout"] == 5400


@pytest.mark.parametrize(("timeout", "message"), [
    (0, "--trial-timeout must be at least 60 seconds, got 0"),
    (30, "--trial-timeout must be at least 60 seconds, got 30: Azure ML reads a shorter duration as days"),
    ("0.5m", "--trial-timeout must be at least 60 seconds, got 0.5m: Azure ML reads a shorter duration as "
             "days"),
    ("1h30", r"--trial-timeout 1h30: not a duration; use seconds \(90\) or units: 90s, 15m, 2h, 1d, 1h30m$"),
])
def test_a_trial_timeout_azure_would_change_is_refused(project, tmp_path, timeout, message):
    with pytest.raises(JobSpecError, match=f"^{message}"):
        submission.dry_run(spec(sweep=sweep(trial_timeout=timeout)), tmp_path / "job.yml")


@pytest.mark.parametrize(("given", "seconds"), [("3600", 3600), ("1h", 3600), ("90m", 5400), ("1h30m", 5400)])
def test_cli_takes_a_trial_timeout_in_seconds_or_units(project, capsys, given, seconds):
    code = main(["submit", "sweep", *JOB, "--json", "--space", "space.yaml", "--metric", "eval_loss",
                 "--trial-timeout", given])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["sweep"]["trial_timeout"] == seconds


def test_cli_refuses_a_trial_timeout_that_is_no_duration_in_one_line(project, capsys):
    code = main(["submit", "sweep", *JOB, "--space", "space.yaml", "--metric", "eval_loss",
                 "--trial-timeout", "1h30"])

    assert code == 2
    assert capsys.readouterr().err == ("hvdazure: error: --trial-timeout 1h30: not a duration; use seconds "
                                       "(90) or units: 90s, 15m, 2h, 1d, 1h30m\n")


@pytest.mark.parametrize("kind", [sweep, in_job])
def test_a_set_argument_the_search_space_overrides_is_a_warning_naming_the_field(project, tmp_path, kind):
    args = ["--set", "lr=0.1", "--set=extra.hidden=16", "--set", "epochs=3"]
    result = submission.dry_run(spec(script_args=args, sweep=kind()), tmp_path / "job.yml")

    overridden = [w for w in result.job.warnings if "overridden by the search space" in w]
    assert overridden == [
        "the script's argument --set lr is overridden by the search space (space.yaml): every trial sets lr",
        "the script's argument --set extra.hidden is overridden by the search space (space.yaml): every "
        "trial sets extra.hidden"]


def sized(fake: FakeWorkspace, cluster: ClusterSpec, **overrides) -> list[str]:
    """Submit with create_compute=cluster; the warnings printed."""
    warnings: list[str] = []
    job = spec(processes_per_node=None, compute=cluster.name, **overrides)
    submission.submit(job, WORKSPACE, credential=FakeCredential(), create_compute=cluster,
                      warn=warnings.append, client_options={"transport": RecordingTransport(fake)})
    return warnings


def test_create_compute_for_a_sweep_sizes_the_cluster_for_its_concurrent_trials(project, fake):
    warnings = sized(fake, ClusterSpec("sweep-cluster", "Standard_ND96asr_v4", max_nodes=None),
                     sweep=sweep(trials=12, max_concurrent_trials=3))

    (put,) = [b for m, p, b in fake.calls if m == "PUT" and p == "/computes/sweep-cluster"]
    assert put["properties"]["properties"]["scaleSettings"]["maxNodeCount"] == 6  # 3 trials x 2 nodes
    assert not [w for w in warnings if "node(s)" in w]


def test_create_compute_for_a_command_job_sizes_the_cluster_for_its_nodes(project, fake):
    sized(fake, ClusterSpec("job-cluster", "Standard_ND96asr_v4", max_nodes=None), sweep=None)

    (put,) = [b for m, p, b in fake.calls if m == "PUT" and p == "/computes/job-cluster"]
    assert put["properties"]["properties"]["scaleSettings"]["maxNodeCount"] == 2


@pytest.mark.parametrize(("cluster", "message"), [
    (ClusterSpec("gpu-cluster", "Standard_ND96asr_v4", max_nodes=None),  # exists, with 4 nodes at most
     "compute gpu-cluster has up to 4 node(s), so 2 of the sweep's 3 concurrent trials of 2 node(s) run at "
     "once (6 nodes would run them all): the others queue"),
    (ClusterSpec("small-cluster", "Standard_ND96asr_v4", max_nodes=2),
     "compute small-cluster has up to 2 node(s), so 1 of the sweep's 3 concurrent trials of 2 node(s) run at "
     "once (6 nodes would run them all): the others queue"),
])
def test_a_cluster_too_small_for_the_concurrent_trials_is_a_warning_saying_why(project, fake, cluster,
                                                                               message):
    warnings = sized(fake, cluster, sweep=sweep(trials=12, max_concurrent_trials=3))

    assert message in warnings


def test_cli_create_compute_leaves_the_cluster_size_to_the_job(project, monkeypatch):
    seen = {}
    monkeypatch.setattr(submission, "submit", lambda spec, workspace, **kw: seen.update(kw) or 1 / 0)

    with pytest.raises(ZeroDivisionError):
        main(["submit", "sweep", "train.py", "--compute", "new-cluster", "--vm-size", "Standard_ND96asr_v4",
              "--image", IMAGE, "--space", "space.yaml", "--metric", "eval_loss", "--create-compute"])

    assert seen["create_compute"] == ClusterSpec("new-cluster", "Standard_ND96asr_v4", max_nodes=None)
