"""A workspace's jobs through Azure ML's SDK v2 (azure-ai-ml): `MLClient.jobs` list, get, begin_cancel,
stream and download.

The job resource (`jobs.get`) has the job as submitted and its status, but not when it ran or what went
wrong: those are Run History's, as studio shows them, read with azure-ai-ml's own Run History client (the
one its `jobs.stream` and `jobs.download` use). `jobs.list` lists the whole workspace, newest first; the
experiment's jobs are picked from it page by page until there are `limit`.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvdazure.azure.errors import JobError
from hvdazure.azure.records.checkpoints import CheckpointPlace, Reader
from hvdazure.azure.records.job import JobDetails, JobSummary, RunFacts, iso_time, run_facts
from hvdazure.azure.workspace import WorkspaceRef

# azure-ai-ml logs at INFO that it could not read a tenant id from the token (for the studio URL)
logging.getLogger("azure.ai.ml.operations._job_operations").setLevel(logging.WARNING)
DEFAULT_OUTPUT = "default"  # the job's own files (./outputs, logs): Azure ML's output of that name


class V2Jobs:
    """The jobs of one workspace, through azure-ai-ml's MLClient: the JobsClient (sdk.py) of V2Sdk.jobs."""

    sdk = "v2"
    named_outputs = True

    def __init__(self, workspace: WorkspaceRef, ml_client: Any) -> None:
        """`ml_client`: azure-ai-ml's MLClient for `workspace` (V2Sdk.jobs: v2.submit.client's)."""
        self.workspace = workspace
        self.ml_client = ml_client

    def recent(self, experiment: str, limit: int) -> list[JobSummary]:
        found = []
        for job in self.ml_client.jobs.list():
            if job is not None and job.experiment_name == experiment:
                found.append(job)
                if len(found) == limit:
                    break
        return [JobSummary(name=job.name, status=_status(job), display_name=job.display_name,
                           created=_created(job), duration_s=self._facts(job.name).duration_s(),
                           compute=job.compute) for job in found]

    def details(self, name: str) -> JobDetails:
        job = self._job(name)
        resources = getattr(job, "resources", None)
        return JobDetails(
            name=job.name, sdk=self.sdk, status=_status(job), experiment=job.experiment_name,
            display_name=job.display_name, compute=job.compute,
            nodes=getattr(resources, "instance_count", None), studio_url=job.studio_url,
            command=getattr(job, "command", None), created=_created(job), facts=self._facts(name),
            inputs={key: str(value.path) for key, value in (getattr(job, "inputs", None) or {}).items()
                    if getattr(value, "path", None)},
            outputs={key: str(getattr(value, "path", None) or "")
                     for key, value in (getattr(job, "outputs", None) or {}).items()
                     if key != DEFAULT_OUTPUT},
            tags=dict(job.tags or {}), job_type=getattr(job, "type", None))

    def stream(self, name: str) -> None:
        """azure-ai-ml's jobs.stream, which raises once a failed job's logs are printed: that is no error
        of the streaming (jobs.stream_job reports how the job ended)."""
        from azure.ai.ml.exceptions import JobException

        try:
            self.ml_client.jobs.stream(name)
        except JobException:
            if _status(self._job(name)) != "Failed":
                raise

    def cancel(self, name: str) -> None:
        self.ml_client.jobs.begin_cancel(name).result()

    def download(self, job: JobDetails, output: str | None, destination: Path) -> None:
        self.ml_client.jobs.download(job.name, download_path=str(destination), output_name=output,
                                     all=output is None)

    def reader(self, job: JobDetails, place: CheckpointPlace) -> Reader | None:
        """Files of the checkpoint directory in an output (its datastore path) or among the job's files (the
        `default` output: the artifact store's ExperimentRun/dcid.NAME), downloaded one at a time."""
        from azure.ai.ml._artifacts._artifact_utilities import download_artifact_from_aml_uri

        if place.kind == "output":
            output, _, below = place.where.partition("/")
            base = job.outputs.get(output) or self._output_uri(job.name, output)
        else:
            output, below = DEFAULT_OUTPUT, place.where
            base = self._output_uri(job.name, DEFAULT_OUTPUT)
        if not base:
            return None
        directory = "/".join(part.strip("/") for part in (base, below) if part.strip("/"))

        def read(relative: str) -> bytes | None:
            with tempfile.TemporaryDirectory(prefix="hvdazure-read-") as tmp:
                download_artifact_from_aml_uri(f"{directory}/{relative}", tmp, self.ml_client.datastores)
                found = Path(tmp) / Path(relative).name
                return found.read_bytes() if found.is_file() else None

        return read

    def _job(self, name: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self.ml_client.jobs.get(name)
        except ResourceNotFoundError:
            raise JobError(f"job {name} not found in workspace {self.workspace.workspace_name}") from None

    def _facts(self, name: str) -> RunFacts:
        """Run History's record of the job: when it ran, its error and warnings (the job resource has
        none of them)."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            record = self.ml_client.jobs._runs_operations.get_run(name)
        except ResourceNotFoundError:  # a job Run History has no record of yet: no times to show
            return RunFacts()
        return run_facts(record if isinstance(record, Mapping) else None)

    def _output_uri(self, name: str, output: str) -> str | None:
        """Where the service put an output (azure-ai-ml's own lookup, as its jobs.download does)."""
        return self.ml_client.jobs._get_named_output_uri(name, output).get(output)


def _status(job: Any) -> str:
    status = job.status
    return str(getattr(status, "value", status) or "Unknown")


def _created(job: Any) -> str | None:
    context = getattr(job, "creation_context", None)
    return iso_time(getattr(context, "created_at", None))
