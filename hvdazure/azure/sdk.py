"""The one seam between hvdazure and an Azure ML SDK: the AzureSdk protocol, which SDK v2 (v2.submit.V2Sdk)
and SDK v1 (v1.submit.V1Sdk) each implement once, and the values both return. No Azure SDK here.

An AzureSdk works offline first (check, write, validate: what a dry run does) and then, connected to a
workspace, looks up or creates the compute and submits; its `jobs` are the workspace's jobs as `hvdazure
jobs` and `--resume-from` read them (a JobsClient: v2.jobs.V2Jobs, v1.jobs.V1Jobs). submission.sdk_for
chooses the SDK once, from `--sdk`, for submit, its dry run and `hvdazure jobs`: none of them branches on
the SDK's name again. Each SDK dispatches once on the job's kind (resolved_job.py) to the form it sends that
kind in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hvdazure.azure.compute import ClusterSpec, ComputeInfo
from hvdazure.azure.errors import SubmitError
from hvdazure.azure.records.checkpoints import CheckpointPlace, Reader
from hvdazure.azure.records.job import JobDetails, JobSummary
from hvdazure.azure.resolved_job import ResolvedJob
from hvdazure.azure.workspace import WorkspaceRef

# Printed once by every command that takes `--sdk v1` (submission.warn_of_sdk, from V1Sdk.end_of_support).
# What v1 still gives is in the Azure ML guide's "SDK v1" section; keep the two in step.
V1_END_OF_SUPPORT = ("--sdk v1: Azure ML SDK v1 (azureml-core) is past Microsoft's end of support "
                     "(2026-06-30); v2 (azure-ai-ml) is the default and runs every hvdazure feature; v1 "
                     "still gives azureml-core's run forms (a ScriptRunConfig run, a HyperDrive sweep) and "
                     "reads the runs submitted with it")


@dataclass(frozen=True)
class Submitted:
    """A job the service accepted (which says nothing yet about it running)."""

    name: str
    studio_url: str | None
    sdk: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "studio_url": self.studio_url, "sdk": self.sdk}

    def report(self) -> list[str]:
        return [f"submitted job {self.name} (SDK {self.sdk})", f"studio: {self.studio_url or 'unknown'}"]


@dataclass(frozen=True)
class OfflineCheck:
    """What a dry run's offline validation covered, for its report."""

    checked: str  # what the SDK loaded back and compared
    how_to_submit: str  # the command that submits what was written
    notes: tuple[str, ...] = ()  # what the job runs beyond the summary (a HyperDrive trial's entry)
    command: str | None = None  # what the SDK runs, where that is not the job's command (HyperDrive's trial)


class WorkspaceConnection(Protocol):
    """An SDK connected to one workspace with one credential."""

    def check_references(self, job: ResolvedJob) -> None:
        """Look up what the job names in the workspace (data assets, a registered environment): a missing
        one is a SubmitError naming it, before any cluster is created or anything uploaded."""
        ...

    def compute_vm_size(self, compute: str) -> str | None:
        """The compute's VM size; an unknown compute is a SubmitError now, not after the upload."""
        ...

    def create_compute(self, cluster: ClusterSpec) -> ComputeInfo:
        """Get or create the AmlCompute cluster."""
        ...

    def submit(self, job: ResolvedJob, files: list[Path], stream: bool) -> Submitted:
        """Upload and submit `job` as written in `files` (write_yaml's, checked by validate_offline)."""
        ...


class JobsClient(Protocol):
    """One SDK's view of a workspace's jobs (v2.jobs.V2Jobs, v1.jobs.V1Jobs), from AzureSdk.jobs. Each method
    raises JobError for a job the workspace does not have; any other SDK error goes up as it is
    (jobs.service_errors)."""

    sdk: str
    workspace: WorkspaceRef
    named_outputs: bool  # whether its jobs have named outputs (`hvdazure submit --output`: SDK v2 only)

    def recent(self, experiment: str, limit: int) -> list[JobSummary]:
        """The experiment's newest `limit` jobs, newest first."""
        ...

    def details(self, name: str) -> JobDetails:
        """The job, with what Run History says of it (times, error, warnings)."""
        ...

    def stream(self, name: str) -> None:
        """Print the job's logs until it ends (what `hvdazure submit --stream` does)."""
        ...

    def cancel(self, name: str) -> None:
        """Ask the service to cancel the job."""
        ...

    def download(self, job: JobDetails, output: str | None, destination: Path) -> None:
        """Download the job's files and named outputs (or only the output `output`) into `destination`, in
        records/download.py's layout."""
        ...

    def reader(self, job: JobDetails, place: CheckpointPlace) -> Reader | None:
        """A reader of the files of the checkpoint directory `place` among the job's files or outputs, or
        None where this SDK cannot read it."""
        ...


class AzureSdk(Protocol):
    """One Azure ML SDK: the offline steps of a submission, the connection for the rest, and the workspace's
    jobs."""

    sdk: str  # "v2" or "v1", as --sdk names it
    end_of_support: str | None  # the one line every command with this --sdk prints (V1_END_OF_SUPPORT)

    def check_supported(self, job: ResolvedJob) -> None:
        """Refuse, offline, what this SDK cannot submit (JobSpecError)."""
        ...

    def write_yaml(self, job: ResolvedJob, path: str | Path) -> list[Path]:
        """Write the job as the SDK serialises it; returns the files written, the job's last."""
        ...

    def validate_offline(self, job: ResolvedJob, files: list[Path]) -> dict[str, Any]:
        """Load the files back with the SDK and check they say what `job` says; returns the request body."""
        ...

    def describe_check(self, job: ResolvedJob, body: dict[str, Any], names: list[str]) -> OfflineCheck:
        """What validate_offline checked of `body`, and how to submit the files `names`."""
        ...

    def connect(self, workspace: WorkspaceRef, credential: Any,
                client_options: dict[str, Any]) -> WorkspaceConnection:
        """The SDK's client for `workspace` (`client_options` go to SDK v2's MLClient)."""
        ...

    def jobs(self, workspace: WorkspaceRef, credential: Any, client_options: dict[str, Any]) -> JobsClient:
        """The jobs of `workspace` through this SDK (`client_options` go to SDK v2's MLClient and SDK v1's
        Workspace as connect's do)."""
        ...


SubmitSdk = AzureSdk  # the protocol's name before it also held the jobs


def compute_not_found(compute: str) -> SubmitError:
    """The one line for a compute the workspace lacks, whichever SDK looked."""
    return SubmitError(f"compute {compute!r} not found in the workspace: create it with `hvdazure azure "
                       f"compute create {compute} --vm-size SIZE --max-nodes N`")


def output_file(path: str | Path) -> Path:
    """`path` made absolute, its directory created: where write_yaml writes."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
