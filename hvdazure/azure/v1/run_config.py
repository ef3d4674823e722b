"""The run configuration of an SDK v1 (azureml-core) run: a `ScriptRunConfig` with an MPI layout, built,
serialised and loaded back. The command job (v1/submit.py) runs it as it is, and a HyperDrive sweep
(v1/sweep.py) as each trial's configuration.

A job whose ranks run `python SCRIPT ARGS` is the configuration's script and arguments; any other (an in-job
sweep's `python -m hvdazure.sweep ...`) is its `command`, which azureml-core 1.61 takes instead: as one
shell-quoted string, since azureml-core joins a list with spaces, unquoted, before sending it.

The configuration has `MpiConfiguration(process_count_per_node, node_count)`, Docker on
(`DockerConfiguration(use_docker=True, shm_size=...)`), and an `Environment` on the Docker image: with the
image alone its Python is used as it is (`user_managed_dependencies`), with a conda file that file is
built on top. `CondaDependencies.create()` is never used: it adds pip options that need network access
to PyPI from the cluster.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from hvdazure.azure.errors import SubmitError, redacted_line
from hvdazure.azure.resolved_job import ResolvedJob

_RUN_FIELDS = ("runId", "description")  # run_fields: sent beside the configuration


def build_run_config(job: ResolvedJob, workspace: Any = None) -> Any:
    """The ScriptRunConfig for `job`. A registered environment is looked up in `workspace` when given
    (a dry run has none and references it by name and version); the service cancels the run after the job's
    max duration (default: azureml-core's, 30 days)."""
    from azureml.core import Environment, ScriptRunConfig
    from azureml.core.runconfig import DockerConfiguration, MpiConfiguration

    spec = job.environment
    if spec.registered:
        if workspace is not None:
            environment = registered_environment(workspace, job)
        else:  # a stand-in: run_configuration writes only its name and version
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
        environment.version = spec.version  # named and versioned by content, as SDK v2 registers it
        environment.environment_variables.clear()  # the SDK's EXAMPLE_ENV_VAR placeholder (the setter warns)
    entry = {"script": job.script, "arguments": list(job.script_args)} if runs_script(job) else {
        "command": job.command}
    config = ScriptRunConfig(
        source_directory=str(job.code_dir),
        **entry,
        max_run_duration_seconds=max_run_duration(job),
        compute_target=job.compute,
        environment=environment,
        distributed_job_config=MpiConfiguration(process_count_per_node=job.processes_per_node,
                                                node_count=job.nodes),
        docker_runtime_config=DockerConfiguration(use_docker=True, shm_size=job.shm_size or "2g",
                                                  arguments=shlex.split(job.docker_args or "")),
    )
    config.run_config.environment_variables = dict(job.env)
    # --identity user: azureml-core's credential passthrough (it has no managed identity: submit.py refuses)
    config.run_config.credential_passthrough = job.identity is not None and job.identity.kind == "user"
    return config


def max_run_duration(job: ResolvedJob) -> int:
    """The run's max_run_duration_seconds: the job's max duration, or azureml-core's default (30 days)."""
    from azureml.core import ScriptRunConfig

    return job.max_duration or ScriptRunConfig.MAX_DURATION_SECONDS_DEFAULT


def run_fields(job: ResolvedJob) -> dict[str, str]:
    """What a submission sends of the run beside its configuration, for the dry run's file: its id
    (`--name`, Experiment.submit's run_id or HyperDrive's custom run id) and its description (set on the run
    once it exists)."""
    return {key: value for key, value in (("runId", job.name), ("description", job.description))
            if value is not None}


def registered_environment(workspace: Any, job: ResolvedJob) -> Any:
    """The workspace's environment the job names (its latest version for `@latest`), as azureml-core sends
    it; one that is missing is one line, before the snapshot is uploaded."""
    from azureml.core import Environment

    spec = job.environment
    try:
        return Environment.get(workspace, spec.name, version=spec.version)
    except Exception as exc:  # azureml-core raises a bare Exception naming the HTTP code
        if "Code: 404" in str(exc):
            raise SubmitError(f"environment {spec.reference} not found in the workspace") from None
        raise


def run_configuration(job: ResolvedJob, config: Any) -> dict[str, Any]:
    """A ScriptRunConfig as azureml-core serialises it (its repr): the `Configuration` of the request that
    starts the run, with the script and its arguments copied in as Experiment.submit does, and the code
    directory. (`RunConfiguration.save` would also write a conda_dependencies.yml of the SDK's placeholder
    packages, which an image-based job does not use.) A registered environment is written as its name and
    version only (null: the latest): the submission sends the workspace's definition of it, which a dry run
    cannot know, and not the SDK's default one (EXAMPLE_ENV_VAR, Python 3.8, azureml-defaults)."""
    from azureml.core.script_run_config import get_run_config_from_script_run

    data = json.loads(repr(get_run_config_from_script_run(config)))
    if job.environment.registered:
        data["environment"] = {"name": job.environment.name, "version": job.environment.version}
    return {"sourceDirectory": str(job.code_dir), **data}


def check_run_configuration(job: ResolvedJob, data: dict[str, Any], name: str) -> dict[str, Any]:
    """Load a serialised run configuration with azureml-core and check it says what `job` says."""
    from azureml.core.runconfig import RunConfiguration

    data = {key: value for key, value in data.items() if key not in ("sourceDirectory", *_RUN_FIELDS)}
    try:
        loaded = RunConfiguration._get_runconfig_using_dict(data)  # what RunConfiguration.load does
    except Exception as exc:
        raise SubmitError(f"azureml-core cannot load {name} back: {redacted_line(exc)}") from None
    found = {"script": loaded.script, "arguments": list(loaded.arguments),
             "command": loaded.command or None, "nodeCount": loaded.node_count,
             "mpi": {"processCountPerNode": loaded.mpi.process_count_per_node,
                     "nodeCount": loaded.mpi.node_count},
             "environment": {"name": loaded.environment.name, "version": loaded.environment.version},
             "credentialPassthrough": bool(loaded.credential_passthrough),
             "maxRunDurationSeconds": loaded.max_run_duration_seconds}
    script, arguments, command = (job.script, list(job.script_args), None) if runs_script(job) else (
        None, [], job.command)
    wanted = {"script": script, "arguments": arguments, "command": command, "nodeCount": job.nodes,
              "mpi": {"processCountPerNode": job.processes_per_node, "nodeCount": job.nodes},
              "environment": {"name": job.environment.name, "version": job.environment.version},
              "credentialPassthrough": job.identity is not None and job.identity.kind == "user",
              "maxRunDurationSeconds": max_run_duration(job)}
    if found != wanted:
        raise SubmitError(f"{name} does not load back as written: {found} != {wanted}")
    return found


def check_run_fields(job: ResolvedJob, data: dict[str, Any], name: str) -> None:
    """The run's id and description in a dry run's file (run_fields) are the job's."""
    found = {key: data.get(key) for key in _RUN_FIELDS}
    wanted = {key: run_fields(job).get(key) for key in _RUN_FIELDS}
    if found != wanted:
        raise SubmitError(f"{name} does not load back with the run's id and description: {found} != {wanted}")


def runs_script(job: ResolvedJob) -> bool:
    """True when the job's ranks run `python SCRIPT ARGS`, which a ScriptRunConfig's script does."""
    return job.argv == ("python", job.script, *job.script_args)
