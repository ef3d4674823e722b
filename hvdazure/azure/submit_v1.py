"""Submitting a JobPlan with Azure ML's legacy SDK v1 (azureml-core), for workspaces that still use it.

azureml-core has been out of support since 2026-06-30; it is imported only here, only for `--sdk v1`.
The job is a `ScriptRunConfig` with `MpiConfiguration(process_count_per_node, node_count)`, Docker on
(`DockerConfiguration(use_docker=True, shm_size=...)`), and an `Environment` on the Docker image: with the
image alone its Python is used as it is (`user_managed_dependencies`), with a conda file that file is
built on top. `CondaDependencies.create()` is never used: it adds pip options that need network access
to PyPI from the cluster. `Experiment.submit` uploads the snapshot and starts the run.

Inputs and outputs (`--input`, `--output`) are SDK v2 features here; v1 jobs read data from a datastore
path the script is given. So is `--in-job-sweep` (its ranks run `python -m hvdazure.sweep`, which a
ScriptRunConfig's script cannot be). `--sweep` submits a HyperDrive run whose trial is this job (sweep_v1.py).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from hvdazure._version import __version__
from hvdazure.azure.errors import JobSpecError, SubmitError, one_line
from hvdazure.azure.job_spec import JobPlan
from hvdazure.azure.submit_v2 import Submitted
from hvdazure.azure.sweep_spec import InJobSweepPlan, SweepPlan
from hvdazure.azure.workspace import WorkspaceRef


def check_supported(plan: JobPlan) -> None:
    """What SDK v1 jobs cannot do, refused offline."""
    if plan.inputs or plan.outputs:
        raise JobSpecError("--input and --output need SDK v2 (the default); with --sdk v1, pass the script a "
                           "datastore path instead")
    if isinstance(plan.sweep, InJobSweepPlan):
        raise JobSpecError("--in-job-sweep needs SDK v2 (the default): an SDK v1 ScriptRunConfig runs a "
                           "script file, not `python -m hvdazure.sweep`")
    if isinstance(plan.sweep, SweepPlan):
        from hvdazure.azure import sweep_v1

        sweep_v1.check_supported(plan)


def build_run_config(plan: JobPlan, workspace: Any = None) -> Any:
    """The ScriptRunConfig for `plan`. A registered environment is looked up in `workspace` when given
    (a dry run has none and references it by name and version)."""
    from azureml.core import Environment, ScriptRunConfig
    from azureml.core.runconfig import DockerConfiguration, MpiConfiguration

    if plan.sweep is not None:
        raise JobSpecError("build_run_config takes a command job; a sweep's trial: sweep_v1.trial_plan")
    check_supported(plan)
    spec = plan.environment
    if spec.registered:
        if workspace is not None:
            environment = Environment.get(workspace, spec.name, version=spec.version)
        else:
            environment = Environment(spec.name)
            environment.version = spec.version
    else:
        if spec.conda_file:
            environment = Environment.from_conda_specification(spec.name, str(spec.conda_file))
        else:
            environment = Environment(spec.name)
            environment.python.user_managed_dependencies = True  # the image's own Python, as it is
            environment.python.interpreter_path = "python"
        environment.docker.base_image = spec.image
        environment.environment_variables.clear()  # the SDK's EXAMPLE_ENV_VAR placeholder (the setter warns)
    config = ScriptRunConfig(
        source_directory=str(plan.code_dir),
        script=plan.script,
        arguments=list(plan.script_args),
        compute_target=plan.compute,
        environment=environment,
        distributed_job_config=MpiConfiguration(process_count_per_node=plan.processes_per_node,
                                                node_count=plan.nodes),
        docker_runtime_config=DockerConfiguration(use_docker=True, shm_size=plan.shm_size or "2g",
                                                  arguments=shlex.split(plan.docker_args or "")),
    )
    config.run_config.environment_variables = dict(plan.env)
    return config


def write_yaml(plan: JobPlan, path: str | Path) -> list[Path]:
    """Serialise the run configuration to `path` as YAML (a sweep: see sweep_v1.write_yaml)."""
    import yaml

    if isinstance(plan.sweep, SweepPlan):
        from hvdazure.azure import sweep_v1

        return sweep_v1.write_yaml(plan, path)
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(run_configuration(plan, build_run_config(plan)), sort_keys=False))
    return [path]


def run_configuration(plan: JobPlan, config: Any) -> dict[str, Any]:
    """A ScriptRunConfig as azureml-core serialises it (its repr): the `Configuration` of the request that
    starts the run, with the script and its arguments copied in as Experiment.submit does, and the code
    directory. (`RunConfiguration.save` would also write a conda_dependencies.yml of the SDK's placeholder
    packages, which an image-based job does not use.)"""
    from azureml.core.script_run_config import get_run_config_from_script_run

    return {"sourceDirectory": str(plan.code_dir), **json.loads(repr(get_run_config_from_script_run(config)))}


def validate_offline(plan: JobPlan, files: list[Path]) -> dict[str, Any]:
    """Load the run configuration back and check its MPI layout, script and arguments against the plan."""
    import yaml

    if isinstance(plan.sweep, SweepPlan):
        from hvdazure.azure import sweep_v1

        return sweep_v1.validate_offline(plan, files)
    (path,) = files
    return check_run_configuration(plan, yaml.safe_load(path.read_text()), path.name)


def check_run_configuration(plan: JobPlan, data: dict[str, Any], name: str) -> dict[str, Any]:
    """Load a serialised run configuration with azureml-core and check it says what `plan` says."""
    from azureml.core.runconfig import RunConfiguration

    data = {key: value for key, value in data.items() if key != "sourceDirectory"}
    try:
        loaded = RunConfiguration._get_runconfig_using_dict(data)  # what RunConfiguration.load does
    except Exception as exc:
        raise SubmitError(f"azureml-core cannot load {name} back: {one_line(exc)}") from None
    found = {"script": loaded.script, "arguments": list(loaded.arguments), "nodeCount": loaded.node_count,
             "mpi": {"processCountPerNode": loaded.mpi.process_count_per_node,
                     "nodeCount": loaded.mpi.node_count}}
    wanted = {"script": plan.script, "arguments": list(plan.script_args), "nodeCount": plan.nodes,
              "mpi": {"processCountPerNode": plan.processes_per_node, "nodeCount": plan.nodes}}
    if found != wanted:
        raise SubmitError(f"{name} does not load back as written: {found} != {wanted}")
    return found


def workspace(ref: WorkspaceRef, credential: Any) -> Any:
    """The v1 Workspace, authenticated with the same azure-identity credential as v2."""
    from azureml.core import Workspace
    from azureml.core.authentication import TokenAuthentication

    def token_for(audience: str) -> str:
        return credential.get_token(audience.rstrip("/") + "/.default").token

    auth = TokenAuthentication(token_for, cloud="AzureCloud")
    return Workspace(ref.subscription_id, ref.resource_group, ref.workspace_name, auth=auth)


def compute_vm_size(ws: Any, compute: str) -> str | None:
    from azureml.core.compute import ComputeTarget
    from azureml.exceptions import ComputeTargetException

    try:
        return getattr(ComputeTarget(workspace=ws, name=compute), "vm_size", None)
    except ComputeTargetException:
        raise SubmitError(f"compute {compute!r} not found in the workspace: create it with `hvdazure azure "
                          f"compute create {compute} --vm-size SIZE --max-nodes N`") from None


def submit(plan: JobPlan, ws: Any, stream: bool = False) -> Submitted:
    """Upload the snapshot and start the run (the same ScriptRunConfig write_yaml serialises; a sweep: the
    HyperDrive run sweep_v1 builds)."""
    if isinstance(plan.sweep, SweepPlan):
        from hvdazure.azure import sweep_v1

        with sweep_v1.entry_file(plan.code_dir):  # in the snapshot that Experiment.submit uploads
            return start(plan, ws, sweep_v1.build_config(plan, ws), stream)
    return start(plan, ws, build_run_config(plan, ws), stream)


def start(plan: JobPlan, ws: Any, config: Any, stream: bool) -> Submitted:
    """`Experiment.submit(config)` (a ScriptRunConfig or a HyperDriveConfig), named and tagged."""
    from azureml.core import Experiment

    run = Experiment(ws, plan.experiment).submit(config, tags={"hvdazure": __version__, **plan.tags})
    run.display_name = plan.display_name
    if stream:
        run.wait_for_completion(show_output=True)
    return Submitted(name=run.id, studio_url=run.get_portal_url(), sdk="v1")
