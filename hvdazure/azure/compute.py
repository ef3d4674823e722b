"""Getting or creating an Azure ML compute cluster (AmlCompute) with SDK v2, for `hvdazure azure compute
create` and `hvdazure submit --create-compute`. A cluster that exists is used as it is, never changed."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from hvdazure.azure import vm_sizes
from hvdazure.azure.errors import JobSpecError

# Azure ML's compute names: letters, digits and '-', starting with a letter (azure-ai-ml checks none; the
# service's lengths differ by kind: 2 to 16 for clusters in azureml-core's own check, 3 to 24 for compute
# instances), so up to 32, which hvdazure has always taken, is refused only by the service
_COMPUTE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{1,31}$")


def check_compute_name(name: object, option: str) -> str:
    """`name` when it is an Azure ML compute name, else one line naming it."""
    if not isinstance(name, str) or not name.strip():
        raise JobSpecError(f"{option}: name the Azure ML compute cluster to run on")
    if not _COMPUTE_NAME.match(name.strip()):
        raise JobSpecError(f"{option} {name!r}: 2 to 32 letters, digits and '-', starting with a letter "
                           "(Azure ML's compute names)")
    return name.strip()


@dataclass(frozen=True)
class ClusterSpec:
    """An AmlCompute cluster: `min_nodes` 0 lets it scale to nothing when idle for `idle_seconds`.
    `max_nodes` None: as many as the job it is created for holds at once (`hvdazure submit
    --create-compute`; submission.submit sizes it, for a sweep job nodes x concurrent trials)."""

    name: str
    vm_size: str
    max_nodes: int | None
    min_nodes: int = 0
    low_priority: bool = False  # cheaper, preemptible VMs (hvdazure checkpoints on preemption)
    idle_seconds: int = 600

    def validate(self) -> None:
        check_compute_name(self.name, "compute name")
        if not self.vm_size:
            raise JobSpecError("--vm-size is required to create a compute cluster (e.g. Standard_ND96asr_v4)")
        if self.max_nodes is None:
            raise JobSpecError("--max-nodes: give the cluster's largest number of nodes")
        for option, value, least in (("--max-nodes", self.max_nodes, 1), ("--min-nodes", self.min_nodes, 0),
                                     ("--idle-seconds", self.idle_seconds, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise JobSpecError(f"{option} must be an integer of at least {least}, got {value!r}")
        if self.min_nodes > self.max_nodes:
            raise JobSpecError(f"--min-nodes {self.min_nodes} is above --max-nodes {self.max_nodes}")


@dataclass(frozen=True)
class ComputeInfo:
    """A compute cluster as found or created: its name, VM size, largest size, and whether it is new."""

    name: str
    vm_size: str | None
    max_nodes: int | None
    created: bool

    def describe(self) -> str:
        size = vm_sizes.lookup(self.vm_size)
        gpus = f", {size.gpus} GPU(s) per node" if size else ""
        verb = "created" if self.created else "exists"
        return f"compute {self.name} {verb}: {self.vm_size}{gpus}, up to {self.max_nodes} node(s)"


def get_or_create(ml_client: Any, spec: ClusterSpec) -> ComputeInfo:
    """The cluster named `spec.name`: created from `spec` if the workspace has none of that name."""
    from azure.ai.ml.entities import AmlCompute
    from azure.core.exceptions import ResourceNotFoundError

    spec.validate()
    try:
        existing = ml_client.compute.get(spec.name)
    except ResourceNotFoundError:
        existing = None
    if existing is not None:
        size = getattr(existing, "size", None)
        if size and size.lower() != spec.vm_size.lower():
            print(f"hvdazure: warning: compute {spec.name} exists with VM size {size}, not {spec.vm_size}; "
                  "using it as it is", file=sys.stderr)
        return ComputeInfo(spec.name, size, getattr(existing, "max_instances", None), created=False)
    cluster = AmlCompute(name=spec.name, size=spec.vm_size, min_instances=spec.min_nodes,
                         max_instances=spec.max_nodes, idle_time_before_scale_down=spec.idle_seconds,
                         tier="low_priority" if spec.low_priority else "dedicated")
    created = ml_client.compute.begin_create_or_update(cluster).result()
    return ComputeInfo(spec.name, getattr(created, "size", spec.vm_size),
                       getattr(created, "max_instances", spec.max_nodes), created=True)
