"""`hvdazure jobs list | show | stream | cancel | download` with both SDKs, up to HTTP: nothing here reaches
Azure, and nothing claims a job ran there.

SDK v2's MLClient sends its requests through a transport that answers from tests/fakes/azureml_jobs.py's
AzureMLJobs; SDK v1's, and every blob request, go through `responses` to the same fake. The tests assert
the requests (method, path, body fields) and what hvdazure makes of the answers; the refusals each have a
test. Downloads and the checkpoints they verify are tested against Azurite in
tests/storage/test_azure_jobs_storage.py. Response shapes: tests/unit/fixtures/azure/README.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import responses
from azure.core.exceptions import ClientAuthenticationError
from azure_project import make_project
from fakes.azureml_jobs import JOB, AzureMLJobs, FakeCredential, JobsTransport, serving

from hvdazure._version import __version__
from hvdazure.azure import jobs
from hvdazure.azure.errors import JobError, SubmitError
from hvdazure.azure.resolved_job import VERSION_TAG
from hvdazure.azure.workspace import WorkspaceRef
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
              # `project`: a folder named like the fixtures' experiment, with HOME (azureml-core's caches)
              pytest.mark.project(v1=True, under="w")]
WORKSPACE = WorkspaceRef("sub-id", "rg", "ws")
PREEMPTION_ERROR = ("AzureMLCompute job failed.\nPreemptionError: Nodes of this job got pre-empted. Check if "
                    "the run has failed or restarted. Reason: Received pre-emption warning signal")
PREEMPTION_WARNING = "Low priority compute preemption warning: a node has been preempted."
SDKS = ["v2", "v1"]


@pytest.fixture
def service(project) -> Iterator[AzureMLJobs]:
    fake = AzureMLJobs()
    with serving(fake):
        yield fake


def connect(service: AzureMLJobs, sdk: str) -> jobs.JobsClient:
    return jobs.connect(sdk, WORKSPACE, FakeCredential(), {"transport": JobsTransport(service)} if sdk == "v2"
                        else {})


@pytest.fixture
def cli(service, monkeypatch):
    """`hvdazure ...` as the user runs it, its SDKs talking to `service`."""
    monkeypatch.setattr("hvdazure.azure.workspace.default_credential", FakeCredential)
    real = jobs.connect

    def connected(sdk, workspace=None, credential=None, client_options=None):
        return real(sdk, workspace, credential, {"transport": JobsTransport(service)} if sdk == "v2" else {})

    monkeypatch.setattr(jobs, "connect", connected)
    workspace = ["--subscription", "sub-id", "--resource-group", "rg", "--workspace", "ws"]
    return lambda *words: main([*words, *workspace])


# --- list --------------------------------------------------------------------------------------------------
def test_list_v2_pages_the_workspace_jobs_and_keeps_the_experiments_newest(service):
    service.add_job("digits_2", created="2026-01-03T00:00:00+00:00", status="Running")
    service.add_job("other_1", experiment="other", created="2026-01-04T00:00:00+00:00")
    service.add_job("digits_3", created="2026-01-02T00:00:00+00:00")

    listed = jobs.list_jobs(connect(service, "v2"), "digits", limit=2)

    assert [job.name for job in listed.jobs] == ["digits_2", "digits_3"]
    assert listed.jobs[0].status == "Running"
    assert service.paths("arm")[0] == ("GET", "/jobs")
    # the duration is Run History's (start to end), one record per job listed, none for the others
    assert [p for m, p in service.paths("history")] == ["/runs/digits_2", "/runs/digits_3"]


def test_list_v1_queries_the_experiments_top_level_runs_newest_first(service):
    service.add_job("digits_2", created="2026-01-03T00:00:00+00:00")
    service.add_job("other_1", experiment="other")

    listed = jobs.list_jobs(connect(service, "v1"), "digits", limit=5)

    assert [job.name for job in listed.jobs] == ["digits_2", JOB]
    (query,) = [c for c in service.calls if c.path.endswith("runs:query")]
    assert (query.method, query.path) == ("POST", "/experiments/digits/runs:query")
    assert query.body["filter"] == "(ParentRunId eq null)"
    assert query.body["orderby"] == "StartTimeUtc desc"
    # never the GET-or-create of azureml-core's Experiment(): listing creates no experiment
    assert not [c for c in service.calls if c.method == "PUT" or c.path == "/experiments/digits"]


@pytest.mark.parametrize("sdk", SDKS)
def test_list_reports_status_and_duration(service, sdk):
    (job,) = jobs.list_jobs(connect(service, sdk), "digits").jobs

    assert (job.name, job.status, job.compute) == (JOB, "Completed", "gpu-cluster")
    assert job.duration_s == 2 * 3600 + 90  # 00:03:00 to 02:04:30, to the second
    assert job.row()[:3] == [JOB, "Completed", "2h 01m 30s"]


def test_list_of_an_experiment_without_jobs_says_so(service):
    listed = jobs.list_jobs(connect(service, "v2"), "nothing-here")

    assert listed.report() == ["no jobs in experiment nothing-here (SDK v2)"]


@pytest.mark.parametrize("limit", [0, -1, True])
def test_a_limit_below_one_is_refused(service, limit):
    with pytest.raises(SubmitError, match=r"^--limit must be"):
        jobs.list_jobs(connect(service, "v2"), "digits", limit=limit)


def test_list_defaults_to_the_experiment_submit_names_after_this_directory(cli, service, capsys, project):
    service.add_job("w_1", experiment="project")  # make_project's folder: submit's default experiment

    assert cli("jobs", "list", "--json") == 0

    assert [job["name"] for job in json.loads(capsys.readouterr().out)["jobs"]] == ["w_1"]


# --- show --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sdk", SDKS)
def test_show_has_status_layout_studio_url_version_and_command(service, sdk):
    report = jobs.show_job(connect(service, sdk), JOB)
    job = report.job

    assert (job.status, job.compute, job.nodes, job.experiment) == ("Completed", "gpu-cluster", 2, "digits")
    assert job.hvdazure_version == "0.1.0"  # the tag submit records (VERSION_TAG)
    assert job.studio_url.startswith(f"https://ml.azure.com/runs/{JOB}?wsid=")
    assert job.command.startswith("python train.py --set epochs=10")
    assert (job.facts.started, job.facts.ended) == ("2026-01-01T00:03:00+00:00", "2026-01-01T02:04:30+00:00")
    assert report.preemption is None
    assert f"job {JOB} (SDK {sdk}): Completed, 2h 01m 30s" == report.report()[0]


def test_show_v2_gets_the_job_resource_then_its_run_history_record(service):
    job = jobs.show_job(connect(service, "v2"), JOB).job

    assert service.paths() == [("GET", f"/jobs/{JOB}"), ("GET", ""), ("GET", f"/runs/{JOB}")]
    assert job.inputs == {"data": "azureml://datastores/workspaceblobstore/paths/digits/"}
    assert job.outputs == {"ckpt": "azureml://datastores/workspaceblobstore/paths/runs/digits/"}


def test_a_job_run_history_has_no_record_of_yet_shows_without_times(service):
    del service.runs[JOB]

    job = jobs.show_job(connect(service, "v2"), JOB).job

    assert (job.status, job.facts.started, job.facts.duration_s()) == ("Completed", None, None)


def test_show_v1_reads_the_run_definition_for_the_command_and_nodes(service):
    job = jobs.show_job(connect(service, "v1"), JOB).job

    assert job.command == "python train.py --set epochs=10 --set resume=auto"  # script and arguments
    assert ("GET", f"/experiments/digits/runs/{JOB}/details") in service.paths("history")
    assert job.outputs == {}  # SDK v1 runs have none


@pytest.mark.parametrize("sdk", SDKS)
def test_a_preemption_error_says_so_and_how_to_resume(service, sdk):
    service.set_status(JOB, "Failed", error=PREEMPTION_ERROR)

    report = jobs.show_job(connect(service, sdk), JOB)

    assert report.preemption is not None
    assert report.preemption.reported.startswith("UserError: AzureMLCompute job failed. PreemptionError:")
    # no storage answers here: the step is not known, and the line says where it looked
    where = "output ckpt" if sdk == "v2" else "the job's outputs/checkpoints"
    # the command that works: its arguments without --set resume=auto, which --resume-from refuses; an SDK
    # v1 run is not looked up by --resume-from (SDK v2's), and the line says what to do instead
    how = (f", resume with: hvdazure submit train.py --compute gpu-cluster --nodes 2 --resume-from {JOB} ... "
           "-- --set epochs=10 --set 'checkpoint_dir=${{outputs.ckpt}}'" if sdk == "v2" else
           f"; not resumable with --resume-from: job {JOB} is an SDK v1 run, and --resume-from looks jobs "
           f"up with SDK v2: download its checkpoints (hvdazure jobs download {JOB} --sdk v1) and give them "
           "to a new job as an --input, with -- --set resume=auto --set "
           "resume_from='${{inputs.NAME}}/latest'")
    assert report.report()[-1] == f"preempted (no checkpoint could be read from {where}){how}"


def test_a_preemption_warning_on_a_running_job_says_azure_ml_runs_it_again(service):
    service.set_status(JOB, "Running", warnings=(PREEMPTION_WARNING,))

    report = jobs.show_job(connect(service, "v2"), JOB)

    assert report.job.facts.warnings == (PREEMPTION_WARNING,)
    assert report.report()[-1].endswith("; Azure ML runs it again (status Running)")
    assert report.as_dict()["preemption"]["resume_command"] is None


def test_a_failure_that_is_no_preemption_is_not_called_one(service):
    service.set_status(JOB, "Failed", error="UserError: Execution failed. User process exited with 1")

    report = jobs.show_job(connect(service, "v2"), JOB)

    assert report.preemption is None
    assert report.job.facts.error == "UserError: UserError: Execution failed. User process exited with 1"


# --- cancel ------------------------------------------------------------------------------------------------
def test_cancel_v2_posts_cancel_and_reports_the_status_after(service):
    service.set_status(JOB, "Running")

    cancelled = jobs.cancel_job(connect(service, "v2"), JOB)

    assert ("POST", f"/jobs/{JOB}/cancel") in service.paths("arm")
    assert cancelled.status == "CancelRequested"


def test_cancel_v1_posts_to_the_runs_cancel_uri(service):
    service.set_status(JOB, "Running")

    cancelled = jobs.cancel_job(connect(service, "v1"), JOB)

    assert ("POST", f"/experiments/digits/runId/{JOB}/cancel") in service.paths("execution")
    assert cancelled.status == "CancelRequested"


@pytest.mark.parametrize("sdk", SDKS)
def test_cancelling_a_job_that_ended_is_refused_without_asking_the_service(service, sdk):
    with pytest.raises(JobError, match=rf"^job {JOB} has ended already \(Completed\): nothing to cancel$"):
        jobs.cancel_job(connect(service, sdk), JOB)

    assert not [c for c in service.calls if c.path.endswith("/cancel")]


# --- download's refusals (the downloads themselves: tests/storage) ------------------------------------------
def test_download_of_a_running_job_is_refused(service, tmp_path):
    service.set_status(JOB, "Running")

    with pytest.raises(JobError, match=rf"^job {JOB} is Running: Azure ML downloads a job's files once"):
        jobs.download_job(connect(service, "v2"), JOB, to=tmp_path / "d")

    assert not (tmp_path / "d").exists()


def test_download_of_an_output_the_job_lacks_names_its_outputs(service, tmp_path):
    with pytest.raises(JobError, match=rf"^job {JOB} has no output 'model' \(its outputs: ckpt\)$"):
        jobs.download_job(connect(service, "v2"), JOB, output="model", to=tmp_path)


def test_download_of_a_named_output_with_v1_says_v1_has_none_before_any_request(service, tmp_path):
    client = connect(service, "v1")
    service.calls.clear()

    with pytest.raises(JobError, match=r"^--output ckpt: SDK v1 jobs have no named outputs"):
        jobs.download_job(client, JOB, output="ckpt", to=tmp_path)

    assert service.calls == []


def test_download_over_an_earlier_one_is_refused_before_anything_is_downloaded(service, tmp_path):
    (tmp_path / "named-outputs" / "ckpt").mkdir(parents=True)

    with pytest.raises(JobError, match=r"named-outputs/ckpt exists: remove it, or download into another"):
        jobs.download_job(connect(service, "v2"), JOB, output="ckpt", to=tmp_path)

    assert not [c for c in service.calls if c.service == "blob" or c.path == "/rundata"]


# --- what cannot go on --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sdk", SDKS)
@pytest.mark.parametrize("command", ["show", "cancel", "download"])
def test_a_job_that_does_not_exist_is_one_line(service, sdk, command, tmp_path):
    client = connect(service, sdk)
    call = {"show": lambda: jobs.show_job(client, "nope_1"),
            "cancel": lambda: jobs.cancel_job(client, "nope_1"),
            "download": lambda: jobs.download_job(client, "nope_1", to=tmp_path / "d")}[command]

    with pytest.raises(JobError, match=r"^job nope_1 not found in workspace ws$"):
        call()


@pytest.mark.parametrize("sdk", SDKS)
def test_a_workspace_that_cannot_be_reached_is_one_line_naming_it(service, sdk, monkeypatch):
    from azure.core.pipeline.policies import RetryPolicy

    # azure-core's retries, as many, without their backoff (seconds of sleep)
    monkeypatch.setattr(RetryPolicy, "_sleep_backoff", lambda self, settings, transport: None)
    service.unreachable = True

    with pytest.raises(JobError) as error:
        jobs.list_jobs(connect(service, sdk), "digits")

    assert str(error.value).startswith("cannot reach Azure ML for workspace ws: ")
    assert "Connection refused" in str(error.value)
    assert "\n" not in str(error.value)


def test_no_credential_is_one_line_before_any_request(service):
    class NoCredential:
        def get_token(self, *scopes, **kwargs):
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token.\nMore.")

    with pytest.raises(SubmitError, match=r"^no Azure credentials: run `az login`"):
        jobs.connect("v2", WORKSPACE, NoCredential())

    assert service.calls == []


def test_an_unknown_sdk_is_refused_as_submit_refuses_it(service):
    with pytest.raises(SubmitError, match=r"^--sdk 'v3': expected v2"):
        jobs.connect("v3", WORKSPACE, FakeCredential())


# --- the command line ---------------------------------------------------------------------------------------
def test_show_json_holds_the_job_and_its_preemption(cli, service, capsys):
    service.set_status(JOB, "Failed", error=PREEMPTION_ERROR)

    assert cli("jobs", "show", JOB, "--json") == 0

    shown = json.loads(capsys.readouterr().out)
    assert (shown["name"], shown["status"], shown["nodes"], shown["hvdazure_version"]) == (JOB, "Failed", 2,
                                                                                         "0.1.0")
    assert shown["preemption"]["resume_command"].startswith("hvdazure submit train.py --compute gpu-cluster")


@pytest.mark.parametrize("words", [("jobs", "show", "nope_1"), ("jobs", "cancel", JOB),
                                   ("jobs", "show", JOB, "--sdk", "v3")])
def test_every_refusal_is_one_line_exit_2_and_json_too(cli, capsys, words):
    assert cli(*words) == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert len(printed.err.strip().splitlines()) == 1
    assert printed.err.startswith("hvdazure: error: ")

    assert cli(*words, "--json") == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["exit_code"] == 2
    assert answer["error"] == printed.err.removeprefix("hvdazure: error: ").strip()


@pytest.mark.parametrize(("words", "line"), [
    (("jobs", "list", "--limit", "0"), "argument --limit: must be at least 1, got 0 (see hvdazure jobs list "
                                        "--help)"),
    (("jobs", "list", "--limit", "x"), "argument --limit: must be an integer, got 'x'"),
    (("jobs", "show", JOB, "--sdk", "v3"), "--sdk 'v3': expected v2 (azure-ai-ml, the default) or v1"),
])
def test_a_bad_option_is_refused_before_any_workspace_is_looked_for(tmp_path, monkeypatch, capsys, words,
                                                                    line):
    monkeypatch.chdir(tmp_path)  # no config.json here: the workspace's refusal would come otherwise

    assert _exit_code(lambda: main(list(words))) == 2
    printed = capsys.readouterr().err
    assert line in printed and "workspace" not in printed and len(printed.strip().splitlines()) == 1


def test_a_jobs_command_without_a_name_is_refused_by_the_parser(capsys):
    assert _exit_code(lambda: main(["jobs", "download"])) == 2
    assert "the following arguments are required: name (see hvdazure jobs download --help)" in \
        capsys.readouterr().err


def test_nothing_printed_holds_the_token(cli, service, capsys):
    service.set_status(JOB, "Failed", error=PREEMPTION_ERROR)
    cli("jobs", "show", JOB)
    cli("jobs", "list", "--experiment", "digits", "--sdk", "v1")

    printed = capsys.readouterr()
    assert not re.search(r"eyJ[A-Za-z0-9_-]{8,}", printed.out + printed.err)


# --- what submit records for show to read -------------------------------------------------------------------
def test_submit_tags_the_job_with_the_hvdazure_version_show_reads(tmp_path, monkeypatch):
    from sdk_v2_fakes import BLOB_HOST, FakeWorkspace
    from sdk_v2_fakes import submit as submit_v2_job

    make_project(tmp_path / "s", monkeypatch)
    workspace = FakeWorkspace()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as blob_store:  # the code upload
        for method in ("PUT", "HEAD", "GET"):
            blob_store.add_callback(method, BLOB_HOST, callback=workspace.blob)
        submit_v2_job(workspace)

    assert workspace.job_put()["tags"] == {VERSION_TAG: __version__}


def _exit_code(call) -> int:
    try:
        return call()
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize(("sdk", "told"), [("v1", 1), ("v2", 0)])
def test_a_jobs_command_with_v1_says_once_that_v1_is_past_its_end_of_support(cli, capsys, sdk, told):
    assert cli("jobs", "list", "--experiment", "digits", "--sdk", sdk) == 0

    from hvdazure.azure.submission import V1_END_OF_SUPPORT

    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "end of support" in line] == \
        [f"hvdazure: warning: {V1_END_OF_SUPPORT}"] * told
