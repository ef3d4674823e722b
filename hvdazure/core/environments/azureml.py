"""An Azure ML job: ranks from the launcher Azure ML ran, master address from Azure, and Azure ML's policies.

Azure ML uploads ./outputs with the job, so checkpoints go to ./outputs/checkpoints unless configured.
Shards of remote datasets are cached on the node's local SSD: the job's temporary directory Azure ML names
in AZ_BATCHAI_JOB_TEMP, else the node's shared directory Azure Batch names in AZ_BATCH_NODE_SHARED_DIR (both
on the VM's temporary disk, which every process of the node sees).
Its low-priority nodes are preempted without a documented SIGTERM; Azure announces a preemption ahead in
the instance metadata service's Scheduled Events (scheduled_events.py), which is watched unless turned off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from hvdazure.core.environments.environment import (
    ClusterInfo,
    Environment,
    PreemptionNotices,
    home_cache_dir,
    node_of_rank,
    read_count,
    read_index,
    read_per_node,
)
from hvdazure.core.environments.launchers import Horovodrun, Mpich, OpenMPI, SingleProcess

# The launchers Azure ML runs for an MPI job (or that a user runs inside one), asked in this order.
INNER_LAUNCHERS: tuple[Environment, ...] = (Horovodrun(), OpenMPI(), Mpich())


class AzureML:
    """An Azure ML job: ranks from the MPI or PyTorch launcher Azure ML ran, master address from Azure."""

    name = "azureml"
    # Plain Azure Batch multi-instance tasks set AZ_BATCH_MASTER_NODE too; their ranks come out right as well.
    MARKERS = ("AZUREML_RUN_ID", "AZ_BATCHAI_MPI_MASTER_NODE", "AZ_BATCH_MASTER_NODE")

    def detected(self, env: Mapping[str, str]) -> bool:
        return any(marker in env for marker in self.MARKERS)

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        inner = next((launcher for launcher in INNER_LAUNCHERS if launcher.detected(env)), None)
        if inner is not None:
            info = inner.describe(env)
        elif "WORLD_SIZE" in env:
            info = _torch_style(env, self.name)
        else:
            info = SingleProcess().describe(env)
        return replace(info, launcher=self.name, master_addr=_master_addr(env) or info.master_addr)

    def default_checkpoint_dir(self) -> str | None:
        """./outputs/checkpoints: Azure ML uploads ./outputs, so a retried job finds them."""
        return os.path.join("outputs", "checkpoints")

    def job_id(self, env: Mapping[str, str]) -> str | None:
        """AZUREML_RUN_ID: the job's name, the same when Azure ML runs the job again after a preemption."""
        return env.get("AZUREML_RUN_ID") or None

    def default_cache_dir(self, env: Mapping[str, str]) -> str:
        """The job's temporary directory on the node's local SSD, else Batch's per-node shared directory."""
        for variable in ("AZ_BATCHAI_JOB_TEMP", "AZ_BATCH_NODE_SHARED_DIR"):
            if env.get(variable):
                return os.path.join(env[variable], "hvdazure", "shards")
        return home_cache_dir(env)

    def preemption_notices(self, watch: bool | None, notices_url: str | None) -> PreemptionNotices | None:
        """Azure Scheduled Events (at Azure's metadata address unless `notices_url` is given), unless
        `watch` is False."""
        if watch is False:
            return None
        from hvdazure.core.environments.scheduled_events import ScheduledEventsNotices  # urllib: when asked

        return ScheduledEventsNotices(notices_url)


def _torch_style(env: Mapping[str, str], launcher: str) -> ClusterInfo:
    """RANK, WORLD_SIZE, LOCAL_RANK and NODE_RANK, as Azure ML's PyTorch distribution sets them."""
    size = read_count(env, "WORLD_SIZE")
    rank = read_index(env, "RANK", size, f"WORLD_SIZE={size}")
    # Azure ML documents no per-node count for this mode: take torchrun's LOCAL_WORLD_SIZE or the node count
    # the Azure ML runtime exports, and assume one node only when nothing says there are several.
    if "LOCAL_WORLD_SIZE" in env:
        local_size = read_per_node(env, "LOCAL_WORLD_SIZE", size, "WORLD_SIZE")
    elif "AZUREML_NODE_COUNT" in env:
        nodes = read_count(env, "AZUREML_NODE_COUNT")
        if size % nodes:
            raise ValueError(f"AZUREML_NODE_COUNT={nodes} does not divide WORLD_SIZE={size}")
        local_size = size // nodes
    elif "NODE_RANK" not in env:
        local_size = size
    else:
        raise ValueError(
            f"NODE_RANK={env['NODE_RANK']!r} is set but neither LOCAL_WORLD_SIZE nor AZUREML_NODE_COUNT "
            "says how many processes run per node"
        )
    local_rank = read_index(env, "LOCAL_RANK", local_size, f"{local_size} processes per node")
    node_rank, num_nodes = node_of_rank(rank, size, local_size)
    if "NODE_RANK" in env:
        node_rank = read_index(env, "NODE_RANK", num_nodes, f"{num_nodes} nodes")
    return ClusterInfo(
        rank, size, local_rank, local_size, node_rank, num_nodes, env.get("MASTER_ADDR") or None, launcher
    )


def _master_addr(env: Mapping[str, str]) -> str | None:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    if env.get("AZ_BATCH_MASTER_NODE"):
        # "10.0.0.4:6000"; the port is Azure Batch's own (its docs say not to use it for MPI or NCCL).
        address, _, port = env["AZ_BATCH_MASTER_NODE"].rpartition(":")
        if not address or not port.isdigit():
            raise ValueError(f"AZ_BATCH_MASTER_NODE={env['AZ_BATCH_MASTER_NODE']!r} is not 'address:port'")
        return address
    return env.get("AZ_BATCHAI_MPI_MASTER_NODE") or None
