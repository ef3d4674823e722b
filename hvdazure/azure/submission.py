"""`hvdazure submit` as functions: a dry run that needs no Azure, and a submission with SDK v2 or v1.

Order of a submission, cheapest checks first, nothing uploaded before the last step:
1. the JobSpec is validated offline (job_spec.resolve), and the SDK the user chose is importable;
2. the workspace is named and a credential obtains a token (one line if not);
3. the compute is looked up (or created with --create-compute): its VM size gives the processes per node
   and the NCCL settings when they were not given;
4. the job is written as YAML into a temporary directory and validated by the SDK, as in a dry run;
5. the environment is registered if new, the code uploaded and the job created.

A sweep (`JobSpec.sweep`) takes the same steps: its options are validated in step 1, and the backends write,
validate and submit an Azure ML sweep job (SDK v1: a HyperDrive run) instead of a command job.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure.azure.compute import ClusterSpec, ComputeInfo
from hvdazure.azure.errors import JobSpecError, SubmitError, one_line
from hvdazure.azure.job_spec import JobPlan, JobSpec, resolve
from hvdazure.azure.workspace import WorkspaceRef

SDKS = ("v2", "v1")
DEFAULT_YAML = "hvdazure-job.yml"
_INSTALL_HINT = {"v2": "pip install 'hvdazure[azure]' (azure-ai-ml)",
                 "v1": "pip install 'hvdazure[azure-v1]' (azureml-core)"}


def _warn(message: str) -> None:
    print(f"hvdazure: warning: {message}", file=sys.stderr)


@dataclass(frozen=True)
class DryRunResult:
    """A job checked offline: the files written and the request body the SDK would send."""

    plan: JobPlan
    files: list[Path]
    body: dict[str, Any]
    sdk: str

    def as_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {"dry_run": True, "sdk": self.sdk, "files": [str(f) for f in self.files], "nodes": plan.nodes,
                "processes_per_node": plan.processes_per_node, "world_size": plan.world_size,
                "command": plan.command, "environment": plan.environment.reference,
                "image": plan.environment.image, "warnings": list(plan.warnings),
                **({"sweep": plan.sweep.as_dict()} if plan.sweep else {})}

    def report(self) -> list[str]:
        """What the dry run found, for a person: the layout, the files, what was checked, how to submit."""
        names = [_display_path(f) for f in self.files]
        if self.sdk == "v2":
            from hvdazure.azure.submit_v2 import layout_of

            layout = layout_of(self.body)
            distribution = layout["distribution"]
            checked = ("azure-ai-ml's load_job schema and the REST body ("
                       + ("a Sweep job whose trial has " if layout is not self.body else "")
                       + f"distributionType {distribution['distributionType']}, processCountPerInstance "
                       f"{distribution['processCountPerInstance']}, instanceCount "
                       f"{layout['resources']['instanceCount']})")
            how = " && ".join([*(f"az ml environment create -f {n}" for n in names[:-1]),
                               f"az ml job create -f {names[-1]}"])
        else:
            mpi = self.body["mpi"]
            hyperdrive = ", and azureml-train-core the HyperDriveConfig" if "hyperdrive" in self.body else ""
            checked = ("azureml-core loads the run configuration back (mpi: processCountPerNode "
                       f"{mpi['processCountPerNode']}, nodeCount {mpi['nodeCount']}){hyperdrive}")
            how = "the same hvdazure submit --sdk v1 without --dry-run"
        trial = []
        if "hyperdrive" in self.body:  # what SDK v1's trials run instead of the command above
            entry = shlex.join(["python", self.body["script"], *self.body["arguments"]])
            trial = [f"HyperDrive trial: {entry} --KEY VALUE ... (HyperDrive appends each sampled value)"]
        return [f"dry run (SDK {self.sdk}): nothing was uploaded or submitted", *self.plan.summary(), *trial,
                f"wrote {', '.join(names)}", f"validated offline: {checked}", f"to submit: {how}"]


def dry_run(spec: JobSpec, output_yaml: str | Path = DEFAULT_YAML, sdk: str = "v2",
            warn: Callable[[str], None] = _warn) -> DryRunResult:
    """Validate `spec`, write the job as YAML to `output_yaml` and validate that with the SDK, offline.
    SDK v2 also writes `<stem>.environment.yml` when the environment needs registering."""
    backend = _backend(sdk)
    plan = resolve(spec)
    if sdk == "v1":
        backend.check_supported(plan)
    for warning in plan.warnings:
        warn(warning)
    files = backend.write_yaml(plan, output_yaml)
    return DryRunResult(plan=plan, files=files, body=backend.validate_offline(plan, files), sdk=sdk)


def submit(spec: JobSpec, workspace: WorkspaceRef | Callable[[], WorkspaceRef] | None = None, sdk: str = "v2",
           stream: bool = False, create_compute: ClusterSpec | None = None, credential: Any = None,
           client_options: dict[str, Any] | None = None, warn: Callable[[str], None] = _warn) -> Any:
    """Submit `spec` to Azure ML and return `Submitted(name, studio_url, sdk)`. `workspace` defaults to the
    config.json found from the current directory (a function is called after the offline checks, so a
    wrong job is reported before a missing workspace); `credential` to DefaultAzureCredential.
    `create_compute` gets or creates that cluster first. `client_options` go to SDK v2's MLClient (tests
    pass a `transport`)."""
    from hvdazure.azure import submit_v2
    from hvdazure.azure import workspace as workspace_module

    backend = _backend(sdk)
    # 1. offline: everything but the processes per node, which may come from the compute's VM size
    first = resolve(_with_placeholder_processes(spec))
    if sdk == "v1":
        backend.check_supported(first)
    if create_compute is not None:
        create_compute.validate()
    workspace = workspace() if callable(workspace) else workspace or WorkspaceRef.from_options()
    # 2. credentials
    credential = credential or workspace_module.default_credential()
    workspace_module.check_credential(credential)
    try:
        needs_v2 = sdk == "v2" or create_compute is not None  # clusters are created with SDK v2 only
        ml_client = submit_v2.client(workspace, credential, **(client_options or {})) if needs_v2 else None
        v1_workspace = backend.workspace(workspace, credential) if sdk == "v1" else None
        # 3. the compute
        if create_compute is not None:
            vm_size = _get_or_create_compute(ml_client, create_compute).vm_size
        else:
            vm_size = backend.compute_vm_size(v1_workspace or ml_client, spec.compute)
        if spec.vm_size and vm_size and spec.vm_size.lower() != vm_size.lower():
            warn(f"compute {spec.compute} has VM size {vm_size}, not {spec.vm_size}: using {vm_size}")
        plan = resolve(spec, vm_size=vm_size, snapshot=first.snapshot)
        for warning in plan.warnings:
            warn(warning)
        # 4. the dry run's validation, on the job about to be sent; 5. upload and submit
        with tempfile.TemporaryDirectory(prefix="hvdazure-submit-") as tmp:
            files = backend.write_yaml(plan, Path(tmp) / DEFAULT_YAML)
            backend.validate_offline(plan, files)
            if sdk == "v1":
                return backend.submit(plan, v1_workspace, stream=stream)
            return backend.submit(plan, ml_client, files[-1], stream=stream)
    except SubmitError:
        raise
    except Exception as exc:  # the SDKs' many error types: one redacted line (the CLI's -v shows more)
        raise SubmitError(f"Azure ML: {one_line(exc)}") from exc


def create_compute(cluster: ClusterSpec, workspace: WorkspaceRef | None = None, credential: Any = None,
                   client_options: dict[str, Any] | None = None) -> ComputeInfo:
    """Get or create an AmlCompute cluster (SDK v2)."""
    from hvdazure.azure import submit_v2
    from hvdazure.azure import workspace as workspace_module

    cluster.validate()
    _backend("v2")
    workspace = workspace or WorkspaceRef.from_options()
    credential = credential or workspace_module.default_credential()
    workspace_module.check_credential(credential)
    try:
        return _get_or_create_compute(submit_v2.client(workspace, credential, **(client_options or {})),
                                      cluster)
    except SubmitError:
        raise
    except Exception as exc:
        raise SubmitError(f"Azure ML: {one_line(exc)}") from exc


def _get_or_create_compute(ml_client: Any, cluster: ClusterSpec) -> ComputeInfo:
    from hvdazure.azure import compute

    return compute.get_or_create(ml_client, cluster)


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _backend(sdk: str) -> Any:
    """The submit module for `sdk`, with its SDK importable (checked now, before any work)."""
    if sdk not in SDKS:
        raise JobSpecError(f"--sdk {sdk!r}: expected v2 (azure-ai-ml, the default) or v1 (azureml-core, "
                           "legacy)")
    try:
        if sdk == "v1":
            import azureml.core  # noqa: F401

            from hvdazure.azure import submit_v1 as module
        else:
            import azure.ai.ml  # noqa: F401

            from hvdazure.azure import submit_v2 as module
    except ImportError as exc:
        raise SubmitError(f"--sdk {sdk} needs {_INSTALL_HINT[sdk]}: {one_line(exc)}") from None
    return module


def _with_placeholder_processes(spec: JobSpec) -> JobSpec:
    """The spec with some process count, so the offline checks run before the compute's size is known (one
    trial's ranks for an in-job sweep, whose ranks per trial must divide the job's: checked with the real
    count once the compute's size is known, still before the upload)."""
    if spec.processes_per_node is not None:
        return spec
    return dataclasses.replace(spec, processes_per_node=getattr(spec.sweep, "ranks_per_trial", 1))

