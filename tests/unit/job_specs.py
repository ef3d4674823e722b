"""The job every Azure submission test submits: `spec()`, the project's train.py on 2 nodes of 4 processes of
IMAGE in gpu-cluster, but for the fields a test gives.

A test module whose jobs differ from it in some fields names them once, as
`spec = functools.partial(job_specs.spec, <its fields>)`; a test still overrides any of them by name.
"""

from __future__ import annotations

from typing import Any

from hvdazure.azure.job_spec import JobSpec

IMAGE = "myacr.azurecr.io/hvdazure-gpu:0.1.0"


def spec(**fields: Any) -> JobSpec:
    """A JobSpec of train.py on 2 nodes x 4 processes of IMAGE in gpu-cluster, with `fields` over those."""
    return JobSpec(**{"script": "train.py", "compute": "gpu-cluster", "nodes": 2, "processes_per_node": 4,
                      "image": IMAGE, **fields})
