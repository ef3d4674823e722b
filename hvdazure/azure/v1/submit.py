"""Submitting a ResolvedJob with Azure ML's legacy SDK v1 (azureml-core), for workspaces that still use it.

azureml-core has been out of support since 2026-06-30; it is imported only here and in the modules this one
uses (v1/run_config.py, v1/sweep.py), only for `--sdk v1`. `V1Sdk` is the SubmitSdk (sdk.py)
for it. The job's kind decides its form once (`_form`): a command job is a `ScriptRunConfig`
(v1/run_config.py), and so is an in-job sweep (its `command` is the ranks' `python -m hvdazure.sweep ...`);
an Azure ML sweep job is a HyperDrive run whose trial is that configuration (v1/sweep.py).
`Experiment.submit` uploads the snapshot and starts the run.

Inputs and outputs (`--input`, `--output`), serverless compute and queue settings (`--job-tier`,
`--priority`) are SDK v2 features here; v1 jobs read data from a datastore path the script is given. The
job's name is the run's id, its description set on the run once it exists, its max duration the run's
max_run_duration_seconds (HyperDrive's max_duration_minutes). Clusters are created with SDK v2
(`--create-compute`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure.azure.compute import ClusterSpec, ComputeInfo
from hvdazure.azure.errors import JobSpecError
from hvdazure.azure.resolved_job import CommandJob, InJobSweep, ResolvedJob, SweepJob
from hvdazure.azure.sdk import V1_END_OF_SUPPORT, OfflineCheck, Submitted, compute_not_found, output_file
from hvdazure.azure.v1 import run_config as run_config_v1
from hvdazure.azure.v1.jobs import V1Jobs
from hvdazure.azure.v1.sweep import HyperDriveRun
from hvdazure.azure.workspace import WorkspaceRef


@dataclass(frozen=True)
class ScriptRun:
    """A command job as SDK v1 sends it: the ScriptRunConfig itself."""

    job: ResolvedJob
    also_checked = ""  # for the dry run's report: nothing beyond the run configuration

    def check_supported(self) -> None:
        """A command job needs nothing beyond what V1Sdk checks for every job."""

    def write_yaml(self, path: str | Path) -> list[Path]:
        """Serialise the run configuration to `path` as YAML."""
        import yaml

        path = output_file(path)
        config = run_config_v1.build_run_config(self.job)
        data = {**run_config_v1.run_fields(self.job), **run_config_v1.run_configuration(self.job, config)}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return [path]

    def validate_offline(self, files: list[Path]) -> dict[str, Any]:
        """Load the run configuration back and check its MPI layout, script and arguments against the job,
        and the run's id and description."""
        import yaml

        (path,) = files
        data = yaml.safe_load(path.read_text())
        run_config_v1.check_run_fields(self.job, data, path.name)
        return run_config_v1.check_run_configuration(self.job, data, path.name)

    def submit_arguments(self) -> dict[str, Any]:
        """Experiment.submit's arguments beyond the configuration: the run's id, `--name`."""
        return {"run_id": self.job.name} if self.job.name else {}

    def notes(self, body: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def command(self) -> str | None:
        """What the run runs, where that is not the job's command: nothing here."""
        return None

    @contextmanager
    def run_config(self, workspace: Any) -> Iterator[Any]:
        """The ScriptRunConfig to submit (the one write_yaml serialises, its environment from `workspace`)."""
        yield run_config_v1.build_run_config(self.job, workspace)


def _form(job: ResolvedJob) -> ScriptRun | HyperDriveRun:
    """The one place the job's kind decides what SDK v1 is sent."""
    match job.kind:
        case CommandJob() | InJobSweep():  # the in-job sweep: ScriptRunConfig(command=...)
            return ScriptRun(job)
        case SweepJob() as sweep:
            return HyperDriveRun(job, sweep)


def _check_environment_and_identity(job: ResolvedJob) -> None:
    """What azureml-core cannot send of the job's environment, compute, queue and identity, refused
    offline."""
    if job.environment.registry is not None:
        raise JobSpecError(f"--environment {job.environment.reference}: SDK v1 cannot use registry "
                           "environments (azureml-core's Environment.get reads the workspace only); use "
                           "--sdk v2, or an environment of the workspace, azureml:NAME@latest")
    if job.identity is not None and job.identity.kind == "managed":
        raise JobSpecError("--identity managed needs SDK v2 (the default): azureml-core's run configuration "
                           "has no managed identity, only credential passthrough (--identity user)")
    if job.queue is not None:
        option = "--job-tier" if job.queue.job_tier else "--priority"
        raise JobSpecError(f"{option} needs SDK v2 (the default): azureml-core has no queue settings, and no "
                           "serverless compute")
    if job.serverless:
        raise JobSpecError("--compute serverless needs SDK v2 (the default): azureml-core has no serverless "
                           "compute")
    if job.identity is not None and isinstance(job.kind, SweepJob):
        raise JobSpecError("--identity with --sdk v1 is not for a HyperDrive sweep: azureml-core's "
                           "HyperDrive submission has no credential passthrough; use SDK v2 (the default), "
                           "or `hvdazure submit in-job-sweep`")


def _environment_notes(job: ResolvedJob) -> tuple[str, ...]:
    """For the dry run's report: what is sent of a registered environment, which a dry run cannot read."""
    environment = job.environment
    if not environment.registered:
        return ()
    which = "its latest version" if environment.version is None else f"version {environment.version}"
    return (f"environment {environment.name}: the submission sends the workspace's definition of {which} "
            "(azureml-core's Environment.get); the run configuration written here names it only",)


class V1Sdk:
    """The submitting SDK for `--sdk v1` (azureml-core, legacy)."""

    sdk = "v1"
    end_of_support: str | None = V1_END_OF_SUPPORT

    def check_supported(self, job: ResolvedJob) -> None:
        """What SDK v1 jobs cannot do, refused offline."""
        if job.resume is not None:
            raise JobSpecError(f"--resume-from {job.resume.job} needs SDK v2 (the default): it mounts the "
                               "job's checkpoints as an input, and azureml-core jobs take no inputs here")
        if job.inputs or job.outputs:
            raise JobSpecError("--input and --output need SDK v2 (the default); with --sdk v1, pass the "
                               "script a datastore path instead")
        _check_environment_and_identity(job)
        _form(job).check_supported()

    def write_yaml(self, job: ResolvedJob, path: str | Path) -> list[Path]:
        return _form(job).write_yaml(path)

    def validate_offline(self, job: ResolvedJob, files: list[Path]) -> dict[str, Any]:
        return _form(job).validate_offline(files)

    def describe_check(self, job: ResolvedJob, body: dict[str, Any], names: list[str]) -> OfflineCheck:
        form = _form(job)
        mpi = body["mpi"]
        checked = ("azureml-core loads the run configuration back (mpi: processCountPerNode "
                   f"{mpi['processCountPerNode']}, nodeCount {mpi['nodeCount']}; maxRunDurationSeconds "
                   f"{body['maxRunDurationSeconds']}){form.also_checked}")
        if run_config_v1.run_fields(job):
            checked += f"; the run's {' and '.join(run_config_v1.run_fields(job))} as asked"
        how = "the same hvdazure submit --sdk v1 without --dry-run"
        return OfflineCheck(checked=checked, how_to_submit=how, notes=(*_environment_notes(job),
                                                                       *form.notes(body)),
                            command=form.command())

    def connect(self, workspace: WorkspaceRef, credential: Any,
                client_options: dict[str, Any]) -> V1Connection:
        return V1Connection(workspace, credential, client_options)

    def jobs(self, workspace: WorkspaceRef, credential: Any, client_options: dict[str, Any]) -> V1Jobs:
        return V1Jobs(workspace, V1Connection(workspace, credential, client_options).workspace)


class V1Connection:
    """SDK v1's Workspace, authenticated with the same azure-identity credential as SDK v2's client."""

    def __init__(self, workspace: WorkspaceRef, credential: Any, client_options: dict[str, Any]) -> None:
        from azureml.core import Workspace
        from azureml.core.authentication import Audience, TokenAuthentication

        def token_for(audience: str) -> str:
            return credential.get_token(audience.rstrip("/") + "/.default").token

        class Authentication(TokenAuthentication):
            """TokenAuthentication with the Azure ML token that credential passthrough (--identity user)
            submits with, which azureml-core's own class leaves unimplemented (None)."""

            def _get_azureml_client_token(self) -> str:
                return self._get_aad_token(resource=Audience.AZUREML)

        self._v2 = (workspace, credential, client_options)  # for create_compute
        auth = Authentication(token_for, cloud="AzureCloud")
        self.workspace = Workspace(workspace.subscription_id, workspace.resource_group,
                                   workspace.workspace_name, auth=auth)

    def check_references(self, job: ResolvedJob) -> None:
        if job.environment.registered:  # SDK v1 takes no inputs: the environment is all it names
            run_config_v1.registered_environment(self.workspace, job)

    def compute_vm_size(self, compute: str) -> str | None:
        from azureml.core.compute import ComputeTarget
        from azureml.exceptions import ComputeTargetException

        try:
            return getattr(ComputeTarget(workspace=self.workspace, name=compute), "vm_size", None)
        except ComputeTargetException:
            raise compute_not_found(compute) from None

    def create_compute(self, cluster: ClusterSpec) -> ComputeInfo:
        """Clusters are created with SDK v2, in the same workspace."""
        from hvdazure.azure.v2.submit import V2Sdk

        return V2Sdk().connect(*self._v2).create_compute(cluster)

    def submit(self, job: ResolvedJob, files: list[Path], stream: bool = False) -> Submitted:
        """Upload the snapshot and start the run: `Experiment.submit` of the configuration write_yaml
        serialised (a ScriptRunConfig, or a HyperDriveConfig), named and tagged."""
        from azureml.core import Experiment

        # --identity user: Experiment.submit's own option sets the run's credential passthrough
        passthrough = {"credential_passthrough": True} if job.identity is not None else {}
        form = _form(job)
        with form.run_config(self.workspace) as config:
            run = Experiment(self.workspace, job.experiment).submit(config, tags=job.submitted_tags,
                                                                    **passthrough, **form.submit_arguments())
        run.display_name = job.display_name
        if job.description:
            run.description = job.description
        if stream:
            run.wait_for_completion(show_output=True)
        return Submitted(name=run.id, studio_url=run.get_portal_url(), sdk="v1")
