"""Submitting a JobPlan with Azure ML's SDK v2 (azure-ai-ml): a command job with an MPI distribution.

The job is an `azure.ai.ml.entities.CommandJob` built directly (the `command()` builder's YAML dump does not
load back with `load_job`), and always carries `MpiDistribution(process_count_per_instance=N)`: without it
the service starts one process per node. The experiment name is always set (the SDK otherwise names it
after the current directory). The environment is registered under a name and a content version before the
job references it, so repeated submissions reuse it instead of creating anonymous copies.

The dry run writes the same entity as YAML (`az ml job create -f` format, the code path relative to the
file) and checks it with the SDK's own offline validation: `load_job`'s schema, then the REST body
(`_to_rest_object()`), which catches what the schema misses, such as a `${{inputs.x}}` the job lacks.

With `--sweep`, the job is an Azure ML sweep job whose trial is this command job (sweep_v2.py); it is
written, validated and submitted the same way.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure._version import __version__
from hvdazure.azure.errors import SubmitError, one_line
from hvdazure.azure.job_spec import JobPlan, is_local_path
from hvdazure.azure.sweep_spec import SweepPlan
from hvdazure.azure.workspace import WorkspaceRef

# azure-ai-ml announces its own internal experimental classes on stderr while loading a job; the user did
# not ask for them, so that one logger is kept to errors.
logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)

JOB_SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
ENVIRONMENT_SCHEMA = "https://azuremlschemas.azureedge.net/latest/environment.schema.json"
# the order a person reads a job in; empty sections the SDK writes (properties, parameters) are left out
_YAML_ORDER = ("type", "display_name", "experiment_name", "compute", "code", "command", "environment",
               "environment_variables", "resources", "distribution", "inputs", "outputs", "tags")


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


def build_job(plan: JobPlan) -> Any:
    """The CommandJob for `plan`, or for `--sweep` the SweepJob whose trial it is; the environment is
    referenced by name and version (ensure_environment registers it)."""
    from azure.ai.ml import Input, MpiDistribution, Output
    from azure.ai.ml.entities import CommandJob, JobResourceConfiguration

    what_runs = {  # on every rank: a sweep job's trial
        "code": str(plan.code_dir),
        "command": plan.command,
        "environment": plan.environment.reference,
        "resources": JobResourceConfiguration(instance_count=plan.nodes, shm_size=plan.shm_size,
                                              docker_args=plan.docker_args),
        "distribution": MpiDistribution(process_count_per_instance=plan.processes_per_node),
        "environment_variables": dict(plan.env),
    }
    around_it = {  # a sweep job's, shared by its trials
        "compute": plan.compute,
        "inputs": {i.name: Input(type=i.type, path=_input_path(i.uri), mode=i.mode) for i in plan.inputs},
        "outputs": {o.name: Output(type=o.type, path=o.uri, mode=o.mode) for o in plan.outputs},
        "experiment_name": plan.experiment,
        "display_name": plan.display_name,
        "tags": {"hvdazure": __version__, **plan.tags},
    }
    if isinstance(plan.sweep, SweepPlan):
        from hvdazure.azure import sweep_v2

        return sweep_v2.build(plan.sweep, CommandJob(**what_runs), **around_it)
    return CommandJob(**what_runs, **around_it)


def build_environment(plan: JobPlan) -> Any | None:
    """The Environment to register, or None when the job uses the user's registered one."""
    from azure.ai.ml.entities import Environment

    env = plan.environment
    if env.registered:
        return None
    return Environment(name=env.name, version=env.version, image=env.image,
                       conda_file=str(env.conda_file) if env.conda_file else None,
                       description=f"registered by hvdazure {__version__} submit")


def write_yaml(plan: JobPlan, path: str | Path) -> list[Path]:
    """Write the job (and the environment it needs registered) as YAML for `az ml ... create -f`. Returns
    the files written: the environment's first, as it must be created first."""
    from hvdazure.azure import sweep_v2

    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    sweep = isinstance(plan.sweep, SweepPlan)
    job = _plain(build_job(plan)._to_dict())
    (job["trial"] if sweep else job)["code"] = _relative(plan.code_dir, path.parent)
    order = sweep_v2.YAML_ORDER if sweep else _YAML_ORDER
    ordered = [*(key for key in order if key in job), *(key for key in job if key not in order)]
    job = {key: job[key] for key in ordered if job[key] not in ({}, [], None)}
    if not plan.environment.registered:
        env_path = path.with_name(f"{path.stem}.environment{path.suffix or '.yml'}")
        environment = {"$schema": ENVIRONMENT_SCHEMA, "name": plan.environment.name,
                       "version": plan.environment.version, "image": plan.environment.image}
        if plan.environment.conda_file:
            environment["conda_file"] = _relative(plan.environment.conda_file, env_path.parent)
        _dump(environment, env_path)
        written.append(env_path)
    _dump({"$schema": sweep_v2.SCHEMA if sweep else JOB_SCHEMA, **job}, path)
    written.append(path)
    return written


def validate_offline(plan: JobPlan, files: list[Path]) -> dict[str, Any]:
    """Load the written YAML with the SDK and build the REST body the service would receive; check that it
    says what the plan says (a sweep job's trial: its layout). Returns the body (`properties` of the job
    PUT). Raises SubmitError."""
    from azure.ai.ml import load_environment, load_job
    from azure.ai.ml.entities._job.to_rest_functions import to_rest_job_object

    *env_files, job_file = files
    try:
        for env_file in env_files:
            load_environment(env_file)
        job = load_job(job_file)
        if hasattr(job, "_validate"):  # a command job's schema check; a SweepJob has none beyond load_job's
            job._validate(raise_error=True)
        body = to_rest_job_object(job).as_dict()["properties"]
    except Exception as exc:  # the SDK's ValidationException, marshmallow's, or its own UserErrorException
        raise SubmitError(f"Azure ML's validation rejected {job_file.name}: {one_line(exc)}") from None
    expected = {"distributionType": "Mpi", "processCountPerInstance": plan.processes_per_node}
    what_runs = layout_of(body)
    distribution = what_runs.get("distribution") or {}
    if any(distribution.get(k) != v for k, v in expected.items()) or \
            (what_runs.get("resources") or {}).get("instanceCount") != plan.nodes:
        raise SubmitError(f"{job_file.name} does not say {plan.nodes} nodes x {plan.processes_per_node} MPI "
                          f"processes once loaded: {json.dumps(distribution)}")
    if isinstance(plan.sweep, SweepPlan):
        from hvdazure.azure import sweep_v2

        sweep_v2.check_body(body, plan.sweep, job_file.name)
    return body


def layout_of(body: dict[str, Any]) -> dict[str, Any]:
    """The part of a job's REST body that holds the command, resources and distribution: a sweep job's
    trial, or the command job itself."""
    return body["trial"] if body.get("jobType") == "Sweep" else body


def client(workspace: WorkspaceRef, credential: Any, **kwargs: Any) -> Any:
    """An MLClient for the workspace; `kwargs` go to azure-core's pipeline (tests pass a `transport`)."""
    from azure.ai.ml import MLClient

    return MLClient(credential, workspace.subscription_id, workspace.resource_group, workspace.workspace_name,
                    **kwargs)


def compute_vm_size(ml_client: Any, compute: str) -> str | None:
    """The compute's VM size; an unknown compute is an error now, not after the upload."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        target = ml_client.compute.get(compute)
    except ResourceNotFoundError:
        raise SubmitError(f"compute {compute!r} not found in the workspace: create it with `hvdazure azure "
                          f"compute create {compute} --vm-size SIZE --max-nodes N`") from None
    return getattr(target, "size", None)


def ensure_environment(ml_client: Any, plan: JobPlan) -> None:
    """Register the plan's environment unless that name and version exist (versions follow the content).
    A registered environment the user named must exist: checked now, before the code is uploaded (the SDK
    itself resolves `@latest` only after the upload)."""
    from azure.core.exceptions import ResourceNotFoundError

    environment = build_environment(plan)
    wanted = plan.environment
    try:
        if environment is None:
            ml_client.environments.get(wanted.name, **({"version": wanted.version} if wanted.version
                                                        else {"label": "latest"}))
            return
        ml_client.environments.get(environment.name, version=environment.version)
    except ResourceNotFoundError:
        if environment is None:
            raise SubmitError(f"environment {wanted.reference} not found in the workspace") from None
        ml_client.environments.create_or_update(environment)


def submit(plan: JobPlan, ml_client: Any, job_yaml: Path, stream: bool = False) -> Submitted:
    """Register the environment if needed, upload the code and create the job; optionally follow its logs.
    The job sent is `job_yaml` (write_yaml's, checked by validate_offline) loaded as `az ml job create -f`
    loads it: what a dry run validates is what is submitted."""
    from azure.ai.ml import load_job

    ensure_environment(ml_client, plan)
    created = ml_client.jobs.create_or_update(load_job(job_yaml))
    if stream:
        ml_client.jobs.stream(created.name)
    return Submitted(name=created.name, studio_url=created.studio_url, sdk="v2")


def _input_path(uri: str) -> str:
    """Local paths are uploaded by the SDK: resolve them from the current directory, like the CLI option."""
    return str(Path(uri).resolve()) if is_local_path(uri) else uri


def _relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def _plain(data: Any) -> Any:
    return json.loads(json.dumps(data))  # OrderedDicts and the like, as YAML-safe dicts and lists


def _dump(data: dict[str, Any], path: Path) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
