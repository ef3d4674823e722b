"""A workspace's jobs (runs) through the legacy SDK v1 (azureml-core): `Experiment.get_runs`, `Run.get`,
`Run.get_details`, `Run.cancel`, `Run.wait_for_completion` and `Run.download_files`.

A run's details are Run History's record (status, times, error, warnings, and the run definition: its
script, arguments and node count). SDK v1 runs have no named outputs (`hvdazure submit --sdk v1` takes no
--output): their files are the run's artifacts, ./outputs and the logs, which a download puts under
`artifacts/` as azure-ai-ml's does.
"""

from __future__ import annotations

import itertools
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvdazure.azure.errors import JobError
from hvdazure.azure.records.checkpoints import CheckpointPlace, Reader
from hvdazure.azure.records.download import ARTIFACTS
from hvdazure.azure.records.job import JobDetails, JobSummary, iso_time, run_facts
from hvdazure.azure.workspace import WorkspaceRef


class V1Jobs:
    """The runs of one workspace, through azureml-core's Workspace (authenticated as submit.py's): the
    JobsClient (sdk.py) of V1Sdk.jobs."""

    sdk = "v1"
    named_outputs = False

    def __init__(self, workspace: WorkspaceRef, aml_workspace: Any) -> None:
        """`aml_workspace`: azureml-core's Workspace for `workspace` (V1Sdk.jobs: submit.py's, signed in)."""
        self.workspace = workspace
        self.aml_workspace = aml_workspace

    def recent(self, experiment: str, limit: int) -> list[JobSummary]:
        from azureml.core import Experiment

        # _create_in_cloud=False: listing must not create the experiment it was asked about
        runs = Experiment(self.aml_workspace, experiment, _create_in_cloud=False).get_runs()
        summaries = []
        for run in itertools.islice(runs, limit):
            record = _run_record(run)
            summaries.append(JobSummary(name=run.id, status=str(record.get("status") or "Unknown"),
                                        display_name=record.get("displayName"),
                                        created=iso_time(record.get("createdUtc")),
                                        duration_s=run_facts(record).duration_s(),
                                        compute=record.get("target")))
        return summaries

    def details(self, name: str) -> JobDetails:
        run = self._run(name)
        record = _run_record(run)
        details = run.get_details()
        definition = details.get("runDefinition") or {}
        return JobDetails(
            name=run.id, sdk=self.sdk, status=str(details.get("status") or record.get("status") or "Unknown"),
            experiment=run.experiment.name, display_name=record.get("displayName"),
            compute=details.get("target") or record.get("target"), nodes=_nodes(definition),
            studio_url=run.get_portal_url(), command=_command(definition),
            created=iso_time(record.get("createdUtc")), facts=run_facts(details),
            tags=dict(record.get("tags") or {}))

    def stream(self, name: str) -> None:
        self._run(name).wait_for_completion(show_output=True, raise_on_error=False)  # the end: stream_job's

    def cancel(self, name: str) -> None:
        self._run(name).cancel()

    def download(self, job: JobDetails, output: str | None, destination: Path) -> None:
        self._run(job.name).download_files(output_directory=str(destination / ARTIFACTS))

    def reader(self, job: JobDetails, place: CheckpointPlace) -> Reader | None:
        """Files of a checkpoint directory among the run's own files (SDK v1 runs have no outputs)."""
        if place.kind != "job files":
            return None
        run = self._run(job.name)

        def read(relative: str) -> bytes | None:
            with tempfile.TemporaryDirectory(prefix="hvdazure-read-") as tmp:
                target = Path(tmp) / "file"
                try:
                    run.download_file(f"{place.where}/{relative}", output_file_path=str(target))
                except Exception:  # azureml-core raises its own types for a file the run lacks
                    return None
                return target.read_bytes() if target.is_file() else None

        return read

    def _run(self, name: str) -> Any:
        from azureml.core import Run

        try:
            return Run.get(self.aml_workspace, name)
        except Exception as exc:
            if _status_code(exc) == 404:
                raise JobError(f"job {name} not found in workspace "
                               f"{self.workspace.workspace_name}") from None
            raise


def _run_record(run: Any) -> Mapping[str, Any]:
    """The run as Run History listed it (camelCase, as get_details gives its own)."""
    from azureml._base_sdk_common.common import to_camel_case

    dto = getattr(run, "_run_dto", None) or {}
    return {to_camel_case(key): value for key, value in dict(dto).items()}


def _command(definition: Mapping[str, Any]) -> str | None:
    """What every rank ran: the run definition's command, else `python SCRIPT ARGUMENTS`."""
    if definition.get("command"):
        return str(definition["command"])
    if definition.get("script"):
        return shlex.join(["python", str(definition["script"]), *map(str, definition.get("arguments") or [])])
    return None


def _nodes(definition: Mapping[str, Any]) -> int | None:
    count = (definition.get("mpi") or {}).get("nodeCount") or definition.get("nodeCount")
    return int(count) if isinstance(count, int) else None


def _status_code(exc: BaseException) -> int | None:
    """The HTTP status of azureml-core's exception (its ServiceException, msrest's HttpOperationError)."""
    for source in (exc, getattr(exc, "response", None)):
        for attribute in ("status_code", "status"):
            value = getattr(source, attribute, None)
            if isinstance(value, int):
                return value
    return None
