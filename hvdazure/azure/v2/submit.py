"""Submitting a ResolvedJob with Azure ML's SDK v2 (azure-ai-ml): a command job with an MPI distribution.

The job is an `azure.ai.ml.entities.CommandJob` built directly (the `command()` builder's YAML dump does not
load back with `load_job`), and always carries `MpiDistribution(process_count_per_instance=N)`: without it
the service starts one process per node. The experiment name is always set (the SDK otherwise names it
after the current directory). The environment is registered under a name and a content version before the
job references it, so repeated submissions reuse it instead of creating anonymous copies.

The dry run writes the same entity as YAML (`az ml job create -f` format, the code path relative to the
file) and checks it with the SDK's own offline validation: `load_job`'s schema, then the REST body
(`_to_rest_object()`), which catches what the schema misses, such as a `${{inputs.x}}` the job lacks; and
hvdazure compares the body with the job: layout, identity, inputs, and the job's own settings
(spec/settings.py: name, description, `limits.timeout`, `queue_settings`, no compute for serverless compute)
and outputs (type, mode, registration).

`V2Sdk` is the SubmitSdk (sdk.py) for `--sdk v2`, the default. The job's kind decides its form
once (`_form`): a command job (an in-job sweep is one too, its ranks running the sweep), or for `hvdazure
submit sweep` an Azure ML sweep job whose trial is this command job (v2/sweep.py); either is written,
validated and submitted the same way.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure._version import __version__
from hvdazure.azure import compute
from hvdazure.azure.compute import ClusterSpec, ComputeInfo
from hvdazure.azure.errors import SubmitError, redacted_line
from hvdazure.azure.resolved_job import CommandJob, InJobSweep, QueueSettings, ResolvedJob, SweepJob
from hvdazure.azure.sdk import OfflineCheck, Submitted, compute_not_found, output_file
from hvdazure.azure.spec import data_inputs
from hvdazure.azure.v2.jobs import V2Jobs
from hvdazure.azure.v2.sweep import SweepJobForm
from hvdazure.azure.workspace import WorkspaceRef

# azure-ai-ml announces its own internal experimental classes and fields (queue_settings) on stderr while
# loading a job; the user did not ask for them, so those two loggers are kept to errors.
for _logger in ("azure.ai.ml._utils._experimental", "azure.ai.ml._schema.core.fields"):
    logging.getLogger(_logger).setLevel(logging.ERROR)

JOB_SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
ENVIRONMENT_SCHEMA = "https://azuremlschemas.azureedge.net/latest/environment.schema.json"
# the REST body's spelling of what --priority and --output's modes say (azure-ai-ml's JobPriorityValues)
_REST_PRIORITIES = {1: "low", 2: "medium", 3: "high"}
_REST_OUTPUT_MODES = {"ReadWriteMount": "rw_mount", "Upload": "upload", "Direct": "direct"}
# the order a person reads a job in; empty sections the SDK writes (properties, parameters) are left out
_YAML_ORDER = ("type", "name", "display_name", "description", "experiment_name", "compute", "code",
               "command", "environment", "environment_variables", "resources", "distribution", "limits",
               "queue_settings", "inputs", "outputs", "tags")


@dataclass(frozen=True)
class _CommandJobForm:
    """A command job as SDK v2 sends it: the plain job, and the in-job sweep (its ranks run the sweep)."""

    max_duration: int | None  # the job's limits.timeout
    schema: str = JOB_SCHEMA
    yaml_order: tuple[str, ...] = _YAML_ORDER
    trial_key: str | None = None  # the command, code and layout are the job's own

    def build(self, command_fields: dict[str, Any], shared_fields: dict[str, Any]) -> Any:
        from azure.ai.ml import entities

        limits = entities.CommandJobLimits(timeout=self.max_duration) if self.max_duration else None
        return entities.CommandJob(**command_fields, **shared_fields, limits=limits)

    def check_body(self, body: dict[str, Any], job_file: str) -> None:
        """Nothing beyond the layout, which validate_offline checks for every form."""


def _form(job: ResolvedJob) -> _CommandJobForm | SweepJobForm:
    """The one place the job's kind decides what SDK v2 is sent."""
    match job.kind:
        case SweepJob() as sweep:
            return SweepJobForm(sweep, job.max_duration)
        case CommandJob() | InJobSweep():
            return _CommandJobForm(job.max_duration)


def build_job(job: ResolvedJob) -> Any:
    """The azure-ai-ml job entity for `job`: a CommandJob, or the SweepJob whose trial it is; the environment
    is referenced by name and version (ensure_environment registers it)."""
    from azure.ai.ml import Input, MpiDistribution, Output
    from azure.ai.ml.entities import JobResourceConfiguration, QueueSettings

    command_fields = {  # what every rank runs: a sweep job's trial
        "code": str(job.code_dir),
        "command": job.command,
        "environment": job.environment.reference,
        "resources": JobResourceConfiguration(instance_count=job.nodes, shm_size=job.shm_size,
                                              docker_args=job.docker_args,
                                              instance_type=job.vm_size if job.serverless else None),
        "distribution": MpiDistribution(process_count_per_instance=job.processes_per_node),
        "environment_variables": dict(job.env),
    }
    shared_fields = {  # the job's own; a sweep job's trials share them
        "compute": None if job.serverless else job.compute,  # no compute: Azure ML's serverless compute
        "inputs": {i.name: Input(type=i.type, path=i.uri, mode=i.mode) for i in job.inputs},
        "outputs": {o.name: Output(type=o.type, path=o.uri, mode=o.mode, name=o.asset_name,
                                   version=o.asset_version) for o in job.outputs},
        "experiment_name": job.experiment,
        "name": job.name,
        "display_name": job.display_name,
        "description": job.description,
        "tags": job.submitted_tags,
        "identity": identity_configuration(job),
        "queue_settings": QueueSettings(job_tier=job.queue.job_tier, priority=job.queue.priority)
        if job.queue else None,
    }
    return _form(job).build(command_fields, shared_fields)


def _check_identity(job: ResolvedJob, body: dict[str, Any], job_file: str) -> None:
    """The REST body runs the job as the identity asked for (no `identity`: Azure ML's default)."""
    found = body.get("identity") or None
    wanted: dict[str, str] | None = None
    if job.identity is not None and job.identity.kind == "user":
        wanted = {"identityType": "UserIdentity"}
    elif job.identity is not None:
        client_id = {"clientId": job.identity.client_id} if job.identity.client_id else {}
        wanted = {"identityType": "Managed", **client_id}
    if found != wanted:
        raise SubmitError(f"{job_file} does not load back with the identity asked for: {found} != {wanted}")


def _check_settings(job: ResolvedJob, loaded: Any, body: dict[str, Any], job_file: str) -> None:
    """The job's own settings (spec/settings.py) and its outputs, as `load_job` reads them back and the REST
    body carries them, are those asked for: compute (none for serverless compute), name, description,
    timeout, queue settings, each output's type, mode and registration."""
    from azure.ai.ml._utils.utils import from_iso_duration_format

    queue = job.queue or QueueSettings()
    wanted: dict[str, Any] = {
        "compute": None if job.serverless else job.compute,
        "name": job.name, "description": job.description, "timeout": job.max_duration,
        "queue": (queue.job_tier, queue.priority),
        "outputs": {o.name: (o.type, o.mode, o.asset_name, o.asset_version) for o in job.outputs}}
    queue_body = body.get("queueSettings") or {}
    tier, priority = queue_body.get("jobTier"), queue_body.get("priority")
    outputs = body.get("outputs") or {}
    found = {
        "compute": body.get("computeId"),
        "name": loaded.name if job.name else None, "description": body.get("description"),
        "timeout": from_iso_duration_format((body.get("limits") or {}).get("timeout")),
        "queue": (tier.lower() if tier else None,
                  None if priority is None else _REST_PRIORITIES.get(int(priority))),
        "outputs": {name: (out.get("jobOutputType"), _REST_OUTPUT_MODES.get(out.get("mode")),
                           out.get("assetName"), out.get("assetVersion")) for name, out in outputs.items()}}
    for key, value in wanted.items():
        if found[key] != value:
            raise SubmitError(f"{job_file} does not load back with the {key} asked for: {found[key]} != "
                              f"{value}")


def _check_inputs(job: ResolvedJob, loaded: Any, job_file: str) -> None:
    """Every input, as `load_job` reads it back, is what the job says and is resolved by the submission as
    its kind must be: a URL passed through unchanged, a local path uploaded, a data asset looked up
    (data_inputs.resolution follows azure-ai-ml's JobOperations._resolve_job_input)."""
    from azure.ai.ml._utils._arm_id_utils import is_ARM_id_for_resource

    for spec in job.inputs:
        path = str(loaded.inputs[spec.name].path)
        found = data_inputs.resolution(path, is_ARM_id_for_resource(path))
        wanted = data_inputs.expected_resolution(spec.uri)
        if found != wanted or (wanted != "looked up as a data asset" and path != spec.uri):
            raise SubmitError(f"{job_file}: input {spec.name} loads back as {path!r}, which azure-ai-ml "
                              f"would have {found} when submitting; {spec.uri} is to be {wanted}")


def identity_configuration(job: ResolvedJob) -> Any | None:
    """azure-ai-ml's identity configuration for the job's identity (None: Azure ML's default)."""
    from azure.ai.ml.entities import ManagedIdentityConfiguration, UserIdentityConfiguration

    if job.identity is None:
        return None
    if job.identity.kind == "user":
        return UserIdentityConfiguration()
    return ManagedIdentityConfiguration(client_id=job.identity.client_id)


def build_environment(job: ResolvedJob) -> Any | None:
    """The Environment to register, or None when the job uses the user's registered one."""
    from azure.ai.ml.entities import Environment

    env = job.environment
    if env.registered:
        return None
    return Environment(name=env.name, version=env.version, image=env.image,
                       conda_file=str(env.conda_file) if env.conda_file else None,
                       description=f"registered by hvdazure {__version__} submit")


def layout_of(body: dict[str, Any], form: _CommandJobForm | SweepJobForm) -> dict[str, Any]:
    """The part of a job's REST body that holds the command, resources and distribution: a sweep job's
    trial, or the command job itself."""
    return body[form.trial_key] if form.trial_key else body


class V2Sdk:
    """The submitting SDK for `--sdk v2` (azure-ai-ml), the default."""

    sdk = "v2"
    end_of_support: str | None = None

    def check_supported(self, job: ResolvedJob) -> None:
        """SDK v2 submits every kind of job hvdazure makes."""

    def write_yaml(self, job: ResolvedJob, path: str | Path) -> list[Path]:
        """Write the job (and the environment it needs registered) as YAML for `az ml ... create -f`.
        Returns the files written: the environment's first, as it must be created first."""
        form = _form(job)
        path = output_file(path)
        written = []
        data = _plain(build_job(job)._to_dict())
        layout_of(data, form)["code"] = _relative(job.code_dir, path.parent)
        for spec in job.inputs:  # as given: azure-ai-ml's dump prefixes every path with `azureml:`
            data["inputs"][spec.name]["path"] = spec.uri
        ordered = [*(key for key in form.yaml_order if key in data),
                   *(key for key in data if key not in form.yaml_order)]
        data = {key: data[key] for key in ordered if data[key] not in ({}, [], None)}
        if not job.environment.registered:
            env_path = path.with_name(f"{path.stem}.environment{path.suffix or '.yml'}")
            environment = {"$schema": ENVIRONMENT_SCHEMA, "name": job.environment.name,
                           "version": job.environment.version, "image": job.environment.image}
            if job.environment.conda_file:
                environment["conda_file"] = _relative(job.environment.conda_file, env_path.parent)
            _dump(environment, env_path)
            written.append(env_path)
        _dump({"$schema": form.schema, **data}, path)
        written.append(path)
        return written

    def validate_offline(self, job: ResolvedJob, files: list[Path]) -> dict[str, Any]:
        """Load the written YAML with the SDK and build the REST body the service would receive; check that
        it says what the job says (a sweep job's trial: its layout). Returns the body (`properties` of the
        job PUT). Raises SubmitError."""
        from azure.ai.ml import load_environment, load_job
        from azure.ai.ml.entities._job.to_rest_functions import to_rest_job_object

        *env_files, job_file = files
        try:
            for env_file in env_files:
                load_environment(env_file)
            loaded = load_job(job_file)
            if hasattr(loaded, "_validate"):  # a command job's schema check; a SweepJob has only load_job's
                loaded._validate(raise_error=True)
            body = to_rest_job_object(loaded).as_dict()["properties"]
        except Exception as exc:  # the SDK's ValidationException, marshmallow's, or its UserErrorException
            raise SubmitError(f"Azure ML's validation rejected {job_file.name}: "
                              f"{redacted_line(exc)}") from None
        form = _form(job)
        expected = {"distributionType": "Mpi", "processCountPerInstance": job.processes_per_node}
        layout = layout_of(body, form)
        distribution = layout.get("distribution") or {}
        if any(distribution.get(k) != v for k, v in expected.items()) or \
                (layout.get("resources") or {}).get("instanceCount") != job.nodes:
            raise SubmitError(f"{job_file.name} does not say {job.nodes} nodes x {job.processes_per_node} "
                              f"MPI processes once loaded: {json.dumps(distribution)}")
        form.check_body(body, job_file.name)
        _check_identity(job, body, job_file.name)
        _check_inputs(job, loaded, job_file.name)
        _check_settings(job, loaded, body, job_file.name)
        return body

    def describe_check(self, job: ResolvedJob, body: dict[str, Any], names: list[str]) -> OfflineCheck:
        form = _form(job)
        layout = layout_of(body, form)
        distribution = layout["distribution"]
        checked = ("azure-ai-ml's load_job schema and the REST body ("
                   + ("a Sweep job whose trial has " if form.trial_key else "")
                   + f"distributionType {distribution['distributionType']}, processCountPerInstance "
                   f"{distribution['processCountPerInstance']}, instanceCount "
                   f"{layout['resources']['instanceCount']})")
        if job.inputs:  # _check_inputs: each as the submission will resolve it
            checked += ", and each input as azure-ai-ml resolves it when submitting (" + ", ".join(
                f"{spec.name} {data_inputs.expected_resolution(spec.uri)}" for spec in job.inputs) + ")"
        settings = [what for what, given in (("name", job.name), ("description", job.description),
                                             ("timeout", job.max_duration), ("queue settings", job.queue),
                                             ("outputs", job.outputs)) if given]
        if settings:  # _check_settings
            checked += f"; the job's {', '.join(settings)} as asked"
        how = " && ".join([*(f"az ml environment create -f {n}" for n in names[:-1]),
                           f"az ml job create -f {names[-1]}"])
        return OfflineCheck(checked=checked, how_to_submit=how, notes=_lookup_notes(job))

    def connect(self, workspace: WorkspaceRef, credential: Any,
                client_options: dict[str, Any]) -> V2Connection:
        return V2Connection(client(workspace, credential, **client_options))

    def jobs(self, workspace: WorkspaceRef, credential: Any, client_options: dict[str, Any]) -> V2Jobs:
        return V2Jobs(workspace, client(workspace, credential, **client_options))


class V2Connection:
    """SDK v2's MLClient for one workspace."""

    def __init__(self, ml_client: Any) -> None:
        self.ml_client = ml_client

    def check_references(self, job: ResolvedJob) -> None:
        check_name_is_free(self.ml_client, job)
        ensure_inputs(self.ml_client, job)
        check_registered_environment(self.ml_client, job)

    def compute_vm_size(self, compute: str) -> str | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            target = self.ml_client.compute.get(compute)
        except ResourceNotFoundError:
            raise compute_not_found(compute) from None
        return getattr(target, "size", None)

    def create_compute(self, cluster: ClusterSpec) -> ComputeInfo:
        return compute.get_or_create(self.ml_client, cluster)

    def submit(self, job: ResolvedJob, files: list[Path], stream: bool = False) -> Submitted:
        """Register the environment if needed, upload the code and create the job; optionally follow its
        logs. The job sent is the last of `files` (write_yaml's, checked by validate_offline) loaded as `az
        ml job create -f` loads it: what a dry run validates is what is submitted."""
        from azure.ai.ml import load_job

        ensure_environment(self.ml_client, job)
        created = self.ml_client.jobs.create_or_update(load_job(files[-1]))
        if stream:
            self.ml_client.jobs.stream(created.name)
        return Submitted(name=created.name, studio_url=created.studio_url, sdk="v2")


def client(workspace: WorkspaceRef, credential: Any, **kwargs: Any) -> Any:
    """An MLClient for the workspace; `kwargs` go to azure-core's pipeline (tests pass a `transport`)."""
    from azure.ai.ml import MLClient

    return MLClient(credential, workspace.subscription_id, workspace.resource_group, workspace.workspace_name,
                    **kwargs)


def check_name_is_free(ml_client: Any, job: ResolvedJob) -> None:
    """A job name given with --name must not be taken in the workspace (a job's name is its id): looked up
    before anything is uploaded, where the job PUT would meet the other job only after the upload."""
    from azure.core.exceptions import ResourceNotFoundError

    if job.name is None:
        return
    try:
        ml_client.jobs.get(job.name)
    except ResourceNotFoundError:
        return
    raise SubmitError(f"--name {job.name}: the workspace has a job of that name already (names are unique): "
                      "choose another")


def check_registered_environment(ml_client: Any, job: ResolvedJob) -> None:
    """A registered environment the user named must exist: looked up before the code is uploaded (the SDK
    itself resolves `@latest` only after the upload). A registry's is left to the service (the workspace
    client cannot look into a registry); one hvdazure builds is registered by ensure_environment."""
    from azure.core.exceptions import ResourceNotFoundError

    wanted = job.environment
    if not wanted.registered or wanted.registry is not None:
        return
    try:
        ml_client.environments.get(wanted.name, **({"version": wanted.version} if wanted.version
                                                    else {"label": "latest"}))
    except ResourceNotFoundError:
        raise SubmitError(f"environment {wanted.reference} not found in the workspace") from None


def ensure_environment(ml_client: Any, job: ResolvedJob) -> None:
    """Register the environment hvdazure builds for the job unless that name and version exist (versions
    follow the content); a registered one was looked up by check_registered_environment."""
    from azure.core.exceptions import ResourceNotFoundError

    environment = build_environment(job)
    if environment is None:
        return
    try:
        ml_client.environments.get(environment.name, version=environment.version)
    except ResourceNotFoundError:
        ml_client.environments.create_or_update(environment)

def _lookup_notes(job: ResolvedJob) -> tuple[str, ...]:
    """For the dry run's report: the references only the workspace can confirm, which a submission looks up
    before anything is uploaded."""
    assets = [f"{spec.name} ({asset.reference})" for spec in job.inputs
              if (asset := data_inputs.asset_reference(spec.uri)) is not None]
    if job.environment.registered and job.environment.registry is None:
        assets.append(f"environment {job.environment.reference}")
    if not assets:
        return ()
    return (f"looked up in the workspace when submitting, before any upload: {', '.join(assets)}",)


def ensure_inputs(ml_client: Any, job: ResolvedJob) -> None:
    """Look up every data asset the job's inputs name (`azureml:NAME:VERSION`, `azureml:NAME@latest`) in the
    workspace, as the SDK itself would, but before the environment is registered and the code uploaded
    (azure-ai-ml resolves them only after the upload): a missing one is one line naming it."""
    from azure.ai.ml.exceptions import MlException
    from azure.core.exceptions import ResourceNotFoundError

    for spec in job.inputs:
        asset = data_inputs.asset_reference(spec.uri)
        if asset is None:
            continue
        try:  # by version: a GET of it; by label: the SDK's own resolver (the latest version, then that one)
            ml_client.data.get(asset.name, version=asset.version, label=asset.label)
        except ResourceNotFoundError:
            raise SubmitError(f"--input {spec.name}: data asset {asset.reference} not found in the "
                              "workspace") from None
        except MlException as exc:
            if "does not exist" in str(exc) or isinstance(exc.__cause__, ResourceNotFoundError):
                raise SubmitError(f"--input {spec.name}: data asset {asset.reference} not found in the "
                                  "workspace") from None
            raise SubmitError(f"--input {spec.name}: data asset {asset.reference} cannot be resolved: "
                              f"{redacted_line(exc)}") from None


def _relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def _plain(data: Any) -> Any:
    return json.loads(json.dumps(data))  # OrderedDicts and the like, as YAML-safe dicts and lists


def _dump(data: dict[str, Any], path: Path) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
