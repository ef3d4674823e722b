"""`hvdazure submit --resume-from JOB`: a new job that goes on from job JOB's newest valid checkpoint.

Offline, the dry run's file loaded back by azure-ai-ml (the input that reads the job's checkpoints, the
script's `--set resume=auto --set resume_from=...`) and every refusal that needs no workspace. Up to
HTTP, with the fake workspace of sdk_v2_fakes.py (ARM, discovery, Run History; blob uploads recorded):
the job is looked up first, the job PUT carries the wiring, and a job that cannot be resumed is refused
before anything is uploaded. The jobs looked up are the fixture's (tests/unit/fixtures/azure/README.md) or
ones these tests submitted to the fake; none ran anywhere, and nothing here shows that Azure ML mounts
another job's output as an input.
"""

from __future__ import annotations

import json
from functools import partial

import job_specs
import pytest
from job_specs import IMAGE, rest_body
from sdk_v2_fakes import WORKSPACE, FakeCredential, FakeWorkspace, RecordingTransport, fixture

from hvdazure.azure import submission
from hvdazure.azure.errors import JobError, JobSpecError, SubmitError
from hvdazure.azure.spec.job import InputSpec, JobSpec, OutputSpec
from hvdazure.azure.spec.sweep import InJobSweepSpec, SweepSpec
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
SOURCE = "digits_1767225600_a1b2c3d4"  # the fixture's job: 2 nodes, checkpoints in its output ckpt
SETTING = "resume_from=${{inputs.resume_from}}/latest"
SETTINGS = f"--set resume=auto --set '{SETTING}'"  # as the command line quotes them
SPACE = "lr: {type: choice, values: [0.1, 0.01]}\n"


pytestmark.append(pytest.mark.project(files={"space.yaml": SPACE}))
# a job on 8 nodes (the job resumed ran on 2) that resumes SOURCE
spec = partial(job_specs.spec, nodes=8, processes_per_node=8, script_args=["--set", "epochs=10"],
               resume_from=SOURCE)


# --- the dry run: the wiring in the file and the report, and what it did not check -------------------------
@pytest.mark.parametrize(("args", "outputs", "uri", "where"), [
    # the trainer's default inside Azure ML: the job's own ./outputs/checkpoints, among its files
    ([], [], f"azureml://jobs/{SOURCE}/outputs/artifacts/paths/outputs/checkpoints/",
     "the job's outputs/checkpoints"),
    (["--set", "checkpoint_dir=${{outputs.ckpt}}"], [OutputSpec("ckpt")],
     f"azureml://jobs/{SOURCE}/outputs/ckpt/paths/", "output ckpt"),
    (["--set", "checkpoint_dir=${{outputs.ckpt}}/run1"], [OutputSpec("ckpt")],
     f"azureml://jobs/{SOURCE}/outputs/ckpt/paths/run1/", "output ckpt (run1)"),
    # this job's own would not outlive it (only ./outputs is kept): the trainer's default is assumed instead
    (["--set", "checkpoint_dir=/tmp/ckpt"], [], f"azureml://jobs/{SOURCE}/outputs/artifacts/paths/outputs/"
     "checkpoints/", "the job's outputs/checkpoints"),
])
def test_the_dry_run_reads_the_jobs_checkpoints_through_a_read_only_input_and_sets_resume(
        project, tmp_path, args, outputs, uri, where):
    result = submission.dry_run(spec(script_args=["--set", "epochs=10", *args], outputs=outputs),
                                tmp_path / "job.yml")

    body = rest_body(tmp_path / "job.yml")[1]  # as `az ml job create -f` reads it
    assert body["inputs"]["resume_from"] == {"jobInputType": "uri_folder", "mode": "ReadOnlyMount",
                                             "uri": uri}
    assert body["command"].endswith(f" {SETTINGS}")
    assert body["resources"]["instanceCount"] == 8
    report = result.report()
    assert f"input resume_from: uri_folder {uri} (ro_mount)" in report
    assert (f"resume: job {SOURCE}'s newest valid checkpoint in {where}, read through input resume_from, "
            f"with --set resume=auto --set {SETTING} (the new job writes its own checkpoints and, run again "
            "by Azure ML, goes on from those; the run goes on)") in report
    # a dry run has no workspace: it says it assumed where the checkpoints are, and what a submission does
    assert (f"job {SOURCE} not looked up (a dry run has no workspace): where its checkpoints are is assumed "
            f"from this job's command; a submission reads it from job {SOURCE}'s, and refuses a job that is "
            "missing, not ended, a sweep or keeps no checkpoints, before any upload") in report


def test_checkpoints_at_a_url_are_read_by_the_new_job_itself_without_an_input(project, tmp_path):
    url = "abfs://ckpt@acct.dfs.core.windows.net/digits"
    submission.dry_run(spec(script_args=["--set", f"checkpoint_dir={url}"]), tmp_path / "job.yml")

    body = rest_body(tmp_path / "job.yml")[1]
    assert not body.get("inputs")
    assert body["command"] == (f"python train.py --set checkpoint_dir={url} --set resume=auto "
                               f"--set resume_from={url}/latest")


def test_the_cli_dry_runs_json_holds_the_wiring_and_says_it_was_not_looked_up(project, capsys):
    code = main(["submit", "train.py", "--compute", "gpu-cluster", "--nodes", "4", "--vm-size",
                 "Standard_ND96asr_v4", "--image", IMAGE, "--resume-from", SOURCE, "--dry-run", "--json"])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["resume_from"] == {
        "job": SOURCE, "checkpoints": "the job's outputs/checkpoints", "settings": ["resume=auto", SETTING],
        "input": {"name": "resume_from", "uri": f"azureml://jobs/{SOURCE}/outputs/artifacts/paths/outputs/"
                                                "checkpoints/", "type": "uri_folder", "mode": "ro_mount"},
        "looked_up": False}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"script_args": ["--set", "resume=auto"]},
     rf"^--resume-from {SOURCE} sets resume and resume_from itself \(to job {SOURCE}'s newest valid "
     r"checkpoint\): drop the script's --set resume=\.\.\.$"),
    ({"script_args": ["--set=resume=/ckpt/latest"]}, rf"^--resume-from {SOURCE} sets resume and resume_from"),
    ({"script_args": ["--set", "resume_from=/ckpt/latest"]},
     rf"^--resume-from {SOURCE} sets resume and resume_from itself .*drop the script's --set resume_from="),
    ({"inputs": [InputSpec("resume_from", "azureml:digits@latest")]},
     rf"^--input resume_from: the input --resume-from {SOURCE} reads job {SOURCE}'s checkpoints through"),
    ({"resume_from": "digits 7"}, r"^--resume-from 'digits 7': 1 to 256 letters, digits"),
    ({"sweep": SweepSpec("space.yaml", "eval_loss")},
     rf"^--resume-from {SOURCE}: goes with a command job \(hvdazure submit SCRIPT\), not a sweep"),
    ({"sweep": InJobSweepSpec("space.yaml", "eval_loss")}, rf"^--resume-from {SOURCE}: goes with a command"),
])
def test_what_the_new_job_cannot_be_or_have_is_refused_in_one_line_writing_nothing(project, tmp_path,
                                                                                   overrides, message):
    with pytest.raises(JobSpecError, match=message):
        submission.dry_run(spec(**overrides), tmp_path / "job.yml")

    assert not (tmp_path / "job.yml").exists()


def test_sdk_v1_refuses_it_offline_its_jobs_take_no_inputs(project, tmp_path):
    credential = FakeCredential()
    with pytest.raises(JobSpecError, match=rf"^--resume-from {SOURCE} needs SDK v2 \(the default\): it "
                                           r"mounts the job's checkpoints as an input, and azureml-core jobs "
                                           r"take no inputs here$"):
        submission.submit(spec(), WORKSPACE, sdk="v1", credential=credential)

    assert credential.requests == 0  # before the sign-in


def test_a_sweep_does_not_take_the_option(project, capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(["submit", "sweep", "train.py", "--space", "space.yaml", "--metric", "eval_loss", "--compute",
              "gpu-cluster", "--image", IMAGE, "-ppn", "1", "--resume-from", SOURCE, "--dry-run"])

    assert exit_status.value.code == 2
    assert "unrecognized arguments: --resume-from" in capsys.readouterr().err


# --- submission, up to HTTP --------------------------------------------------------------------------------
def submit(fake: FakeWorkspace, **overrides):
    """Submit spec() to the fake, its processes per node from the compute's VM size (ND96asr v4: 8)."""
    transport = RecordingTransport(fake)
    return submission.submit(spec(processes_per_node=None, **overrides), WORKSPACE,
                             credential=FakeCredential(), client_options={"transport": transport})


def add_source(fake: FakeWorkspace, status: str = "Failed", command: str | None = None,
               outputs: tuple[str, ...] = ("ckpt", "default")) -> None:
    """The fixture's job in the fake workspace, ended `status` (a preemption ends a job Failed)."""
    job = fixture("v2_job_command.json")
    job["properties"]["status"] = status
    job["properties"]["outputs"] = {k: v for k, v in job["properties"]["outputs"].items() if k in outputs}
    if command is not None:
        job["properties"]["command"] = command
    fake.jobs[SOURCE] = job


def nothing_sent_but_lookups(fake: FakeWorkspace) -> bool:
    """Only GETs, and none of what comes after the lookup: no compute, environment, code, blob or job PUT."""
    return all(method == "GET" and not path.startswith(("blob:", "/computes", "/environments", "/codes"))
               for method, path, _ in fake.calls)


def test_the_submission_gets_the_job_first_then_puts_one_that_reads_its_checkpoint_output(project, fake):
    add_source(fake)

    submit(fake, nodes=4)

    calls = [(m, p) for m, p, _ in fake.calls if not p.startswith("blob:")]
    assert calls[0] == ("GET", f"/jobs/{SOURCE}")  # first, before the compute or anything else
    assert ("GET", f"/runs/{SOURCE}") in calls[:4]  # hvdazure jobs' details: Run History's record too
    assert calls.index(("GET", "/computes/gpu-cluster")) == 4
    body = fake.job_put()
    # the job's command put its checkpoints in its output ckpt: read from there, although this job's own
    # command would put its own under ./outputs (a dry run's assumption, which the lookup replaces)
    assert body["inputs"]["resume_from"] == {"jobInputType": "uri_folder", "mode": "ReadOnlyMount",
                                             "uri": f"azureml://jobs/{SOURCE}/outputs/ckpt/paths/"}
    assert body["command"] == f"python train.py --set epochs=10 {SETTINGS}"
    assert (body["resources"]["instanceCount"], body["distribution"]["processCountPerInstance"]) == (4, 8)


@pytest.mark.parametrize(("change", "message"), [
    ({"status": "Running"},
     rf"^--resume-from {SOURCE}: job {SOURCE} is Running: it may still write checkpoints, and would go on "
     rf"training beside the new job; cancel it first \(hvdazure jobs cancel {SOURCE}\) or wait until it "
     r"ends$"),
    ({"outputs": ("default",)},
     rf"^--resume-from {SOURCE}: job {SOURCE}'s command puts its checkpoints in output ckpt, which the job "
     r"does not have \(its outputs: none\)$"),
    ({"command": "python train.py --set checkpoint_dir=/tmp/ckpt"},
     rf"^--resume-from {SOURCE}: job {SOURCE}'s command keeps checkpoints in /tmp/ckpt inside the container, "
     r"which Azure ML does not keep"),
    ({"command": "python -m hvdazure.sweep train.py --space space.yaml --metric eval_loss"},
     rf"^--resume-from {SOURCE}: job {SOURCE} is an in-job sweep, whose trials each keep their own "
     r"checkpoints"),
])
def test_a_job_that_cannot_be_resumed_is_refused_after_its_lookup_before_any_upload(project, fake, change,
                                                                                     message):
    add_source(fake, **change)

    with pytest.raises(SubmitError, match=message):
        submit(fake)

    assert fake.calls[0][:2] == ("GET", f"/jobs/{SOURCE}")
    assert nothing_sent_but_lookups(fake)


def test_a_job_the_workspace_does_not_have_is_one_line_after_its_404(project, fake):
    with pytest.raises(JobError, match=r"^--resume-from digits_9: job digits_9 not found in workspace ws$"):
        submit(fake, resume_from="digits_9")

    assert [call[:2] for call in fake.calls] == [("GET", "/jobs/digits_9")]


def test_a_sweep_job_is_refused_resume_one_of_its_trials(project, fake):
    sweep = JobSpec(script="train.py", compute="gpu-cluster", image=IMAGE,
                    sweep=SweepSpec("space.yaml", "eval_loss"))
    sweep_job = submission.submit(sweep, WORKSPACE, credential=FakeCredential(),
                                  client_options={"transport": RecordingTransport(fake)}).name
    fake.jobs[sweep_job]["properties"]["status"] = "Completed"
    fake.calls.clear()

    with pytest.raises(JobError, match=rf"^--resume-from {sweep_job}: job {sweep_job} is a sweep job, not a "
                                       r"command job: its trials are jobs of their own, each with its "
                                       r"checkpoints; resume one by its name$"):
        submit(fake, resume_from=sweep_job)

    assert nothing_sent_but_lookups(fake)


def test_the_scripts_own_resume_is_refused_before_any_request(project, fake):
    add_source(fake)

    with pytest.raises(JobSpecError, match=rf"^--resume-from {SOURCE} sets resume and resume_from itself"):
        submit(fake, script_args=["--set", "resume=auto"])

    assert fake.calls == []

