"""`hvdazure jobs` as functions: a submitted job's life after `hvdazure submit` (list, show, stream, cancel,
download), with SDK v2 or v1.

Each SDK's jobs are a `JobsClient` (sdk.py: v2.jobs.V2Jobs, v1.jobs.V1Jobs), which `connect` gets from the SDK
submission.sdk_for chooses from `--sdk` (AzureSdk.jobs, the one seam submit uses too); it also finds the
workspace and asks the credential for a token first, as a submission does (a missing login is one line before
any request). What hvdazure adds to the SDKs is here, once for both: a job that does not exist, one that has
ended already, or a service that cannot be reached are one line each (JobError, a
SubmitError: the CLI's exit status 2, as for submit); `show` names a preemption the service reports and the
command that resumes the job (jobs/preempted.py); `download` puts nothing in place before it is complete and
verifies every checkpoint it brought (records/download.py).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from hvdazure.azure.errors import JobError, SubmitError, check_count, redact, redacted_line
from hvdazure.azure.jobs.preempted import Preemption, preemption
from hvdazure.azure.records.checkpoints import CheckpointPlace, LastCheckpoint, last_checkpoint, url_reader
from hvdazure.azure.records.download import Downloaded
from hvdazure.azure.records.job import JobDetails, JobSummary, table
from hvdazure.azure.sdk import JobsClient
from hvdazure.azure.workspace import WorkspaceRef


class Result(Protocol):
    """What each command returns: JSON for --json, lines for a person, and the one line of a failure."""

    def as_dict(self) -> dict[str, Any]: ...

    def report(self) -> list[str]: ...

    def failure(self) -> str | None: ...


@dataclass(frozen=True)
class JobList:
    """`hvdazure jobs list`: an experiment's newest jobs."""

    experiment: str
    sdk: str
    jobs: list[JobSummary]

    def as_dict(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "sdk": self.sdk, "jobs": [job.as_dict() for job in self.jobs]}

    def report(self) -> list[str]:
        if not self.jobs:
            return [f"no jobs in experiment {self.experiment} (SDK {self.sdk})"]
        return table([job.row() for job in self.jobs],
                     ["NAME", "STATUS", "DURATION", "CREATED", "COMPUTE", "DISPLAY NAME"])

    def failure(self) -> str | None:
        return None


@dataclass(frozen=True)
class JobReport:
    """`hvdazure jobs show`: the job, and its preemption when the service reports one."""

    job: JobDetails
    preemption: Preemption | None

    def as_dict(self) -> dict[str, Any]:
        return {**self.job.as_dict(), "preemption": self.preemption.as_dict() if self.preemption else None}

    def report(self) -> list[str]:
        if self.preemption is None:
            return self.job.report()
        return [*self.job.report(), self.preemption.line()]

    def failure(self) -> str | None:
        return None


@dataclass(frozen=True)
class Streamed:
    """`hvdazure jobs stream`: the job as it ended; a failure unless it completed."""

    job: JobDetails

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.job.name, "sdk": self.job.sdk, "status": self.job.status,
                "job_error": self.job.facts.error}

    def report(self) -> list[str]:
        return [f"job {self.job.name} ended: {self.job.status}"]

    def failure(self) -> str | None:
        if self.job.status == "Completed":
            return None
        return f"job {self.job.name} ended {self.job.status}" + (
            f": {self.job.facts.error}" if self.job.facts.error else "")


@dataclass(frozen=True)
class Cancelled:
    """A job the service was asked to cancel, and its status after."""

    name: str
    sdk: str
    status: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sdk": self.sdk, "status": self.status}

    def report(self) -> list[str]:
        return [f"asked Azure ML to cancel job {self.name} (SDK {self.sdk}): now {self.status}"]

    def failure(self) -> str | None:
        return None


def connect(sdk: str = "v2", workspace: WorkspaceRef | Callable[[], WorkspaceRef] | None = None,
            credential: Any = None, client_options: dict[str, Any] | None = None) -> JobsClient:
    """The jobs of `workspace` (default: the config.json found from here; a callable: asked once the SDK is
    known to be there) through SDK `sdk`, after asking `credential` (default: DefaultAzureCredential) for a
    token. `client_options` go to SDK v2's MLClient and SDK v1's Workspace as submit's do (tests pass a
    `transport`)."""
    from hvdazure.azure import workspace as workspace_module
    from hvdazure.azure.submission import sdk_for, warn_of_sdk

    api = sdk_for(sdk)  # an unknown --sdk, or its SDK not installed: the line submit gives
    warn_of_sdk(api)
    workspace = workspace() if callable(workspace) else workspace or WorkspaceRef.from_options()
    credential = credential or workspace_module.default_credential()
    workspace_module.check_credential(credential)
    with service_errors(workspace):
        return api.jobs(workspace, credential, client_options or {})


def list_jobs(jobs: JobsClient, experiment: str, limit: int = 10) -> JobList:
    """The experiment's newest `limit` jobs (status, duration), newest first."""
    check_count(limit, "--limit")
    with service_errors(jobs.workspace):
        return JobList(experiment, jobs.sdk, jobs.recent(experiment, limit))


def show_job(jobs: JobsClient, name: str) -> JobReport:
    """The job; where the service reports it preempted, its last checkpoint and the command that resumes
    it."""
    with service_errors(jobs.workspace):
        job = jobs.details(name)
        return JobReport(job, preemption(job, lambda place: _last_checkpoint(jobs, job, place)))


def stream_job(jobs: JobsClient, name: str, out: TextIO | None = None) -> Streamed:
    """Print the job's logs (to `out`, default stdout) until it ends; returns the job as it ended."""
    with service_errors(jobs.workspace):
        jobs.details(name)  # a job that does not exist: one line, before the SDK's own wait
        with contextlib.redirect_stdout(out or sys.stdout):
            jobs.stream(name)
        return Streamed(jobs.details(name))


def cancel_job(jobs: JobsClient, name: str) -> Cancelled:
    """Ask the service to cancel the job; a job that has ended already is refused."""
    with service_errors(jobs.workspace):
        job = jobs.details(name)
        if job.ended:
            raise JobError(f"job {name} has ended already ({job.status}): nothing to cancel")
        jobs.cancel(name)
        return Cancelled(name, jobs.sdk, jobs.details(name).status)


def download_job(jobs: JobsClient, name: str, output: str | None = None,
                 to: str | Path | None = None) -> Downloaded:
    """Download the job's files and named outputs (or only `output`) to `to` (default: ./NAME), verifying
    every checkpoint among them (Downloaded.failure names a damaged one)."""
    from hvdazure.azure.records import download as job_download

    destination = Path(to) if to is not None else Path(name)
    with service_errors(jobs.workspace):
        if output is not None and not jobs.named_outputs:
            raise JobError(f"--output {output}: SDK {jobs.sdk} jobs have no named outputs (`hvdazure "
                           f"submit --sdk {jobs.sdk}` takes no --output); without --output, the job's files "
                           "and logs")
        job = jobs.details(name)
        if output is not None and output not in job.outputs:
            known = ", ".join(sorted(job.outputs)) or "none"
            raise JobError(f"job {name} has no output {output!r} (its outputs: {known})")
        if not job.ended:
            raise JobError(f"job {name} is {job.status}: Azure ML downloads a job's files once it has ended "
                           f"(`hvdazure jobs stream {name}` follows it until then)")
        return job_download.download(name, jobs.sdk, destination, output,
                                     lambda staging: jobs.download(job, output, staging))


@contextlib.contextmanager
def service_errors(workspace: WorkspaceRef | None = None) -> Iterator[None]:
    """The SDKs' many exception types as one redacted line: a service that cannot be reached says so and
    names the workspace; our own errors pass as they are (the CLI's -v shows the cause)."""
    try:
        yield
    except SubmitError:
        raise
    except Exception as exc:
        raise JobError(service_line(exc, workspace)) from exc


def service_line(exc: BaseException, workspace: WorkspaceRef | None = None) -> str:
    """One line for an SDK's exception (azureml-core's own str() can fail: its type then)."""
    from hvdazure.azure.workspace import _UNREACHABLE

    try:
        line = redacted_line(exc)
        # azureml-core's ServiceException says only its name on the first line, and "Message: ..." below
        message = re.search(r"^\s*Message:\s*(\S.*)$", redact(str(exc)), re.M) if line.endswith(":") else None
        line = f"{type(exc).__name__}: {message[1].strip()}" if message else line
    except Exception:
        line = type(exc).__name__
    if _UNREACHABLE.search(f"{type(exc).__name__} {line}"):
        where = f"workspace {workspace.workspace_name}" if workspace else "the workspace"
        return f"cannot reach Azure ML for {where}: {line}: check the network or a proxy"
    return f"Azure ML: {line}"


def _last_checkpoint(jobs: JobsClient, job: JobDetails, place: CheckpointPlace) -> LastCheckpoint | None:
    """The checkpoint `place`'s `latest` names, read through the SDK (a URL: from here); None if it cannot
    be read."""
    read = url_reader(place.where) if place.kind == "url" else jobs.reader(job, place)
    if read is None:
        return None
    try:
        return last_checkpoint(place, read)
    except Exception:  # the step is a courtesy: a show never fails for it
        return None
