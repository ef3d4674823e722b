"""The job every Azure submission test submits: `spec()`, the project's train.py on 2 nodes of 4 processes of
IMAGE in gpu-cluster, but for the fields a test gives; `rest_body()`, what azure-ai-ml makes of a job file;
`submit_v1()`, spec() submitted with SDK v1;
`sweep()` and `in_job()`, the sweeps of space.yaml a sweep test asks for.

A test module whose jobs differ from it in some fields names them once, as
`spec = functools.partial(job_specs.spec, <its fields>)`; a test still overrides any of them by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.azureml_jobs import FakeCredential

from hvdazure.azure.spec import sweep as sweep_spec
from hvdazure.azure.spec.job import JobSpec

IMAGE = "myacr.azurecr.io/hvdazure-gpu:0.1.0"


def spec(**fields: Any) -> JobSpec:
    """A JobSpec of train.py on 2 nodes x 4 processes of IMAGE in gpu-cluster, with `fields` over those."""
    return JobSpec(**{"script": "train.py", "compute": "gpu-cluster", "nodes": 2, "processes_per_node": 4,
                      "image": IMAGE, **fields})


def rest_body(path: Path) -> tuple[Any, dict]:
    """The job file at `path` loaded afresh, as `az ml job create -f` would, and the REST body it becomes
    (its "properties")."""
    from azure.ai.ml import load_job
    from azure.ai.ml.entities._job.to_rest_functions import to_rest_job_object

    job = load_job(path)
    return job, to_rest_job_object(job).as_dict()["properties"]


def submit_v1(**overrides: Any) -> Any:
    """spec() with `overrides` submitted with SDK v1 to whatever fake serves azureml-core's requests (see
    sdk_v1_fakes.serving), its processes per node left to the compute's VM size."""
    from hvdazure.azure import submission
    from hvdazure.azure.workspace import WorkspaceRef

    return submission.submit(spec(processes_per_node=None, **overrides), WorkspaceRef("sub-id", "rg", "ws"),
                             sdk="v1", credential=FakeCredential())


POLICY_OPTIONS = ("early_termination", "evaluation_interval", "delay_evaluation", "slack_factor",
                  "truncation_percentage")


def sweep(**options) -> sweep_spec.SweepSpec:
    """An Azure ML sweep as `hvdazure submit sweep`'s options give it (the policy's flat, as on the CLI)."""
    policy = sweep_spec.early_termination(*(options.pop(name, None) for name in POLICY_OPTIONS))
    return sweep_spec.SweepSpec(**{"space": "space.yaml", "metric": "eval_loss", "early_termination": policy,
                                   **options})


def in_job(**overrides) -> sweep_spec.InJobSweepSpec:
    """An in-job sweep (`hvdazure submit in-job-sweep`) of space.yaml on eval_loss, with `overrides`."""
    return sweep_spec.InJobSweepSpec(**{"space": "space.yaml", "metric": "eval_loss", **overrides})
