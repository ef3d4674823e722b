"""`hvdazure submit` as functions: a dry run that needs no Azure, and a submission with SDK v2 or v1.

Order of a submission, cheapest checks first, nothing uploaded before the last step:
1. the JobSpec is validated offline (spec.job.resolve), and the SDK the user chose is importable;
2. the workspace is named and a credential obtains a token (one line if not);
3. the job `--resume-from` names is looked up, and refused if it cannot be resumed (resume_from.py); then
   what the job names in the workspace (its name, data assets, a registered environment);
4. the compute is looked up (or created with --create-compute, sized for the nodes the job holds at once:
   a sweep job's concurrent trials): its VM size gives the processes per node and the NCCL settings when
   they were not given; a cluster too small for the job is warned about (serverless compute has no cluster:
   its VM size is --vm-size's);
5. the job is written as YAML into a temporary directory and validated by the SDK, as in a dry run;
6. the environment is registered if new, the code uploaded and the job created.

Each SDK is an AzureSdk (sdk.py: v2.submit.V2Sdk, v1.submit.V1Sdk), chosen once from `--sdk` by `sdk_for`, the
one seam submit, its dry run and `hvdazure jobs` (jobs.connect) go through. A sweep (`JobSpec.sweep`) takes
the same steps: its options are validated in step 1, where the job's kind is decided (resolved_job.py), and
each SDK writes, validates and submits that kind: an Azure
ML sweep job (SDK v1: a HyperDrive run), or a command job whose ranks run the sweep.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure.azure.code_snapshot import is_ignored
from hvdazure.azure.compute import ClusterSpec, ComputeInfo
from hvdazure.azure.errors import JobSpecError, SubmitError, redacted_line
from hvdazure.azure.resolved_job import ResolvedJob
from hvdazure.azure.sdk import V1_END_OF_SUPPORT as V1_END_OF_SUPPORT  # warn_of_sdk's line, named here too
from hvdazure.azure.sdk import AzureSdk, OfflineCheck, Submitted
from hvdazure.azure.spec import resume_from
from hvdazure.azure.spec.job import JobSpec, resolve
from hvdazure.azure.spec.sweep import InJobSweepSpec
from hvdazure.azure.workspace import WorkspaceRef

SDKS = ("v2", "v1")
DEFAULT_YAML = "hvdazure-job.yml"  # the job's file name; a dry run writes it to default_output_yaml
_INSTALL_HINT = {"v2": "pip install 'hvdazure[azure]' (azure-ai-ml)",
                 "v1": "pip install 'hvdazure[azure-v1]' (azureml-core)"}


def _warn(message: str) -> None:
    print(f"hvdazure: warning: {message}", file=sys.stderr)


@dataclass(frozen=True)
class DryRunResult:
    """A job checked offline: the files written, the request body the SDK would send, and what was checked."""

    job: ResolvedJob
    files: list[Path]
    body: dict[str, Any]
    sdk: str
    check: OfflineCheck

    def as_dict(self) -> dict[str, Any]:
        job = self.job
        return {"dry_run": True, "sdk": self.sdk, "files": [str(f) for f in self.files], "nodes": job.nodes,
                "processes_per_node": job.processes_per_node, "world_size": job.world_size,
                "command": self.check.command or job.command, "environment": job.environment.reference,
                "image": job.environment.image, "warnings": list(job.warnings),
                "identity": job.identity.as_dict() if job.identity else None, "name": job.name,
                "description": job.description, "max_duration": job.max_duration,
                "queue_settings": dataclasses.asdict(job.queue) if job.queue else None,
                "outputs": [out.as_dict() for out in job.outputs],
                "resume_from": job.resume.as_dict() if job.resume else None, **job.kind.json_fields()}

    def report(self) -> list[str]:
        """What the dry run found, for a person: the layout, the files, what was checked, how to submit."""
        where = "" if any(_inside(f, self.job.code_dir) for f in self.files) else \
            " (outside the code directory, so not uploaded with it)"
        return [f"dry run (SDK {self.sdk}): nothing was uploaded or submitted",
                *self.job.summary(self.check.command),
                *self.check.notes, f"wrote {', '.join(_display_path(f) for f in self.files)}{where}",
                f"validated offline: {self.check.checked}", f"to submit: {self.check.how_to_submit}"]


def default_output_yaml(job: ResolvedJob, env: Mapping[str, str] | None = None) -> Path:
    """Where a dry run writes the job by default: ~/.cache/hvdazure/dry-run/EXPERIMENT/hvdazure-job.yml
    (XDG_CACHE_HOME/hvdazure/... where that is set), outside the code directory: a file in it would be
    uploaded by the next submission, and counted by the next dry run."""
    from hvdazure.core.environments.environment import home_cache_dir

    hvdazure_cache = Path(home_cache_dir(os.environ if env is None else env)).parent
    return hvdazure_cache / "dry-run" / job.experiment / DEFAULT_YAML


def dry_run(spec: JobSpec, output_yaml: str | Path | None = None, sdk: str = "v2",
            warn: Callable[[str], None] = _warn) -> DryRunResult:
    """Validate `spec`, write the job as YAML to `output_yaml` (default: default_output_yaml, outside the
    code directory) and validate that with the SDK, offline. SDK v2 also writes `<stem>.environment.yml`
    when the environment needs registering. A file written inside the code directory, where the next
    submission would upload it, is warned about unless its ignore file excludes it."""
    api = sdk_for(sdk)
    job = resolve(spec)
    api.check_supported(job)
    warn_of_sdk(api, warn)
    for warning in job.warnings:
        warn(warning)
    files = api.write_yaml(job, default_output_yaml(job) if output_yaml is None else output_yaml)
    uploaded = [f for f in files if _inside(f, job.code_dir)
                and not is_ignored(job.code_dir, f.relative_to(job.code_dir).as_posix())]
    if uploaded:
        warn(f"the dry run's files ({', '.join(_display_path(f) for f in uploaded)}) are inside the code "
             f"directory {job.code_dir}, so submissions upload them with the code: write them elsewhere "
             f"(--output-yaml) or add them to {job.snapshot.ignore_file or '.amlignore'}")
    body = api.validate_offline(job, files)
    check = api.describe_check(job, body, [_display_path(f) for f in files])
    return DryRunResult(job=job, files=files, body=body, sdk=sdk, check=check)


def submit(spec: JobSpec, workspace: WorkspaceRef | Callable[[], WorkspaceRef] | None = None, sdk: str = "v2",
           stream: bool = False, create_compute: ClusterSpec | None = None, credential: Any = None,
           client_options: dict[str, Any] | None = None, warn: Callable[[str], None] = _warn) -> Submitted:
    """Submit `spec` to Azure ML and return `Submitted(name, studio_url, sdk)`. `workspace` defaults to the
    config.json found from the current directory (a function is called after the offline checks, so a
    wrong job is reported before a missing workspace); `credential` to DefaultAzureCredential.
    `create_compute` gets or creates that cluster first. `client_options` go to SDK v2's MLClient (tests
    pass a `transport`)."""
    from hvdazure.azure import workspace as workspace_module

    api = sdk_for(sdk)
    # 1. offline: everything but the processes per node, which may come from the compute's VM size
    first = resolve(_with_placeholder_processes(spec))
    api.check_supported(first)
    if create_compute is not None and first.serverless:
        raise JobSpecError("--create-compute goes with a compute cluster: serverless compute is Azure ML's, "
                           "there is none to create")
    if create_compute is not None:
        create_compute = _sized_for(create_compute, first)
        create_compute.validate()
    warn_of_sdk(api, warn)
    workspace = workspace() if callable(workspace) else workspace or WorkspaceRef.from_options()
    # 2. credentials
    credential = credential or workspace_module.default_credential()
    workspace_module.check_credential(credential)
    try:
        # 3. what the job names in the workspace, before a cluster is created or anything uploaded: first
        # the job it resumes from, then (the SDK's connection) its name, data assets and environment
        resume = None if spec.resume_from is None else \
            resume_from.look_up(spec.resume_from, api.jobs(workspace, credential, client_options or {}))
        connection = api.connect(workspace, credential, client_options or {})
        connection.check_references(first)
        # 4. the compute
        if create_compute is not None:
            cluster = connection.create_compute(create_compute)
            vm_size = cluster.vm_size
            for warning in _too_small(cluster, first):
                warn(warning)
        elif first.serverless:  # no cluster to look up: the VM size asked for is the job's
            vm_size = spec.vm_size
        else:
            vm_size = connection.compute_vm_size(spec.compute)
        if spec.vm_size and vm_size and spec.vm_size.lower() != vm_size.lower():
            warn(f"compute {spec.compute} has VM size {vm_size}, not {spec.vm_size}: using {vm_size}")
        job = resolve(spec, vm_size=vm_size, snapshot=first.snapshot, resume=resume)
        for warning in job.warnings:
            warn(warning)
        # 5. the dry run's validation, on the job about to be sent; 6. upload and submit
        with tempfile.TemporaryDirectory(prefix="hvdazure-submit-") as tmp:
            files = api.write_yaml(job, Path(tmp) / DEFAULT_YAML)
            api.validate_offline(job, files)
            return connection.submit(job, files, stream=stream)
    except SubmitError:
        raise
    except Exception as exc:  # the SDKs' many error types: one redacted line (the CLI's -v shows more)
        raise SubmitError(f"Azure ML: {redacted_line(exc)}") from exc


def create_compute(cluster: ClusterSpec, workspace: WorkspaceRef | None = None, credential: Any = None,
                   client_options: dict[str, Any] | None = None) -> ComputeInfo:
    """Get or create an AmlCompute cluster (SDK v2)."""
    from hvdazure.azure import workspace as workspace_module

    cluster.validate()
    api = sdk_for("v2")
    workspace = workspace or WorkspaceRef.from_options()
    credential = credential or workspace_module.default_credential()
    workspace_module.check_credential(credential)
    try:
        return api.connect(workspace, credential, client_options or {}).create_compute(cluster)
    except SubmitError:
        raise
    except Exception as exc:
        raise SubmitError(f"Azure ML: {redacted_line(exc)}") from exc


def sdk_for(sdk: str) -> AzureSdk:
    """The SDK `--sdk` names, with its SDK importable (checked now, before any work): the one place that
    tells v2 from v1."""
    if sdk not in SDKS:
        raise JobSpecError(f"--sdk {sdk!r}: expected v2 (azure-ai-ml, the default) or v1 (azureml-core, "
                           "legacy)")
    try:
        if sdk == "v1":
            import azureml.core  # noqa: F401

            from hvdazure.azure.v1.submit import V1Sdk

            return V1Sdk()
        import azure.ai.ml  # noqa: F401

        from hvdazure.azure.v2.submit import V2Sdk

        return V2Sdk()
    except ImportError as exc:
        raise SubmitError(f"--sdk {sdk} needs {_INSTALL_HINT[sdk]}: {redacted_line(exc)}") from None


def warn_of_sdk(api: AzureSdk, warn: Callable[[str], None] = _warn) -> None:
    """The SDK's end-of-support line (`--sdk v1`'s V1_END_OF_SUPPORT; none for v2), through `warn`. Every
    command that takes `--sdk` (submit, its dry run, `hvdazure jobs`) calls it once, after `sdk_for` and the
    checks that refuse the command offline, so that a refused command stays one line."""
    if api.end_of_support:
        warn(api.end_of_support)


def _inside(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _sized_for(cluster: ClusterSpec, job: ResolvedJob) -> ClusterSpec:
    """A cluster of no given size, sized for the nodes `job` holds at once (a sweep job's concurrent
    trials each hold `--nodes`)."""
    if cluster.max_nodes is not None:
        return cluster
    return dataclasses.replace(cluster, max_nodes=job.nodes_at_once)


def _too_small(cluster: ComputeInfo, job: ResolvedJob) -> list[str]:
    """What a cluster with fewer nodes than `job` holds at once means for it (one that exists is used as it
    is, and one of a size given may be smaller)."""
    most, needed = cluster.max_nodes, job.nodes_at_once
    if most is None or most >= needed:
        return []
    if most < job.nodes:
        return [f"compute {cluster.name} has up to {most} node(s), fewer than the {job.nodes} the job runs "
                "on: it cannot start until the cluster allows more"]
    return [f"compute {cluster.name} has up to {most} node(s), so {most // job.nodes} of the sweep's "
            f"{needed // job.nodes} concurrent trials of {job.nodes} node(s) run at once ({needed} nodes "
            "would run them all): the others queue"]


def _with_placeholder_processes(spec: JobSpec) -> JobSpec:
    """The spec with some process count, so the offline checks run before the compute's size is known (one
    trial's ranks for an in-job sweep, whose ranks per trial must divide the job's: checked with the real
    count once the compute's size is known, still before the upload)."""
    if spec.processes_per_node is not None:
        return spec
    ranks = spec.sweep.ranks_per_trial if isinstance(spec.sweep, InJobSweepSpec) else 1
    return dataclasses.replace(spec, processes_per_node=ranks)
