"""hvdazure.azure: Azure ML. Submitting jobs (azure-ai-ml, azureml-core) and what runs inside them.

Keep this file free of imports: hvdazure.azure.hyperdrive_args (stdlib only) runs inside every trial of an
SDK v1 sweep, and that import runs this file first. (What every Azure ML job needs at run time, the
environment and its preemption notices, lives in hvdazure/core/environments/.) Modules that need the Azure
SDKs import them themselves.

The submission API (the options of `hvdazure submit`, as Python) is reached through this package and loaded
on first use:

    from hvdazure.azure import JobSpec, WorkspaceRef, dry_run, submit
    spec = JobSpec(script="train.py", compute="gpu-cluster", nodes=2, processes_per_node=4,
                   image="myacr.azurecr.io/hvdazure-torch-gpu:0.1.0", script_args=["--set", "epochs=10"])
    dry_run(spec, "job.yml")                     # offline: writes and validates the YAML
    job = submit(spec, WorkspaceRef.from_config_file("config.json"))   # job.name, job.studio_url
"""

_API = {
    "JobSpec": "spec.job", "parse_input": "spec.job", "parse_output": "spec.job",
    "InputSpec": "resolved_job", "OutputSpec": "resolved_job", "ResolvedJob": "resolved_job",
    "EarlyTermination": "resolved_job",
    "WorkspaceRef": "workspace", "ClusterSpec": "compute",
    "SubmitError": "errors", "JobSpecError": "errors",
    "dry_run": "submission", "submit": "submission", "create_compute": "submission",
    "DryRunResult": "submission", "Submitted": "sdk",
    "SweepSpec": "spec.sweep", "InJobSweepSpec": "spec.sweep",
}


def __getattr__(name: str):  # PEP 562: the submission API, imported when first asked for
    if name not in _API:
        raise AttributeError(f"module 'hvdazure.azure' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"hvdazure.azure.{_API[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
