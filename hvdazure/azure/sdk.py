"""What submission.py needs of an Azure ML SDK: the SubmitSdk protocol, which SDK v2 (submit_v2.py) and SDK v1
(submit_v1.py) each implement once, and the values both return. No Azure SDK here.

A SubmitSdk works offline first (check, write, validate: what a dry run does) and then, connected to a
workspace, looks up or creates the compute and submits. submission.py chooses the SDK once, from
`--sdk`; each dispatches once on the job's kind (resolved_job.py) to the form it sends that kind in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hvdazure.azure.compute import ClusterSpec, ComputeInfo
from hvdazure.azure.errors import SubmitError
from hvdazure.azure.resolved_job import ResolvedJob
from hvdazure.azure.workspace import WorkspaceRef


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


class SubmitSdk(Protocol):
    """One Azure ML SDK: the offline steps of a submission, and the connection for the rest."""

    sdk: str  # "v2" or "v1", as --sdk names it

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


def compute_not_found(compute: str) -> SubmitError:
    """The one line for a compute the workspace lacks, whichever SDK looked."""
    return SubmitError(f"compute {compute!r} not found in the workspace: create it with `hvdazure azure "
                       f"compute create {compute} --vm-size SIZE --max-nodes N`")


def output_file(path: str | Path) -> Path:
    """`path` made absolute, its directory created: where write_yaml writes."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
