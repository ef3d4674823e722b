"""Where this process sits in a distributed job, read from the environment its launcher set.

Usable before ``hvd.init()`` (for example to print only on rank 0 while starting up) and free of any framework
import. Each launcher is one small class answering "am I in this environment, and what is my rank" (the
pattern of Lightning Fabric's ``plugins/environments``); ``detect_cluster`` asks them in priority order.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the job: global and per-node rank, node, master address and launcher."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    master_addr: str | None
    launcher: str  # "azureml", "horovodrun", "openmpi", "mpich" or "single"

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one process that should print, log and save."""
        return self.rank == 0

    @property
    def is_multi_node(self) -> bool:
        """True when the job spans more than one node."""
        return self.num_nodes > 1


class ClusterEnvironment(Protocol):
    """One launcher: whether it started this process, and where it put it."""

    name: str

    def detected(self, env: Mapping[str, str]) -> bool:
        """True if this launcher's variables are in ``env``."""
        ...

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        """Where this launcher put the process; ValueError, naming the variable, on a malformed value."""
        ...


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None:
        raise ValueError(f"{name} is not set")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _count(env: Mapping[str, str], name: str) -> int:
    value = _int(env, name)
    if value < 1:
        raise ValueError(f"{name}={value} must be at least 1")
    return value


def _index(env: Mapping[str, str], name: str, count: int, count_is: str) -> int:
    value = _int(env, name)
    if not 0 <= value < count:
        raise ValueError(f"{name}={value} must be in 0..{count - 1} ({count_is})")
    return value


def _per_node(env: Mapping[str, str], name: str, size: int, size_name: str) -> int:
    local_size = _count(env, name)
    if local_size > size:
        raise ValueError(f"{name}={local_size} is more than {size_name}={size}")
    return local_size


def _derived_node(rank: int, size: int, local_size: int) -> tuple[int, int]:
    # Ranks are numbered node by node (mpirun -map-by slot, which our launcher uses, hydra's default, Azure
    # ML's per-process launch), so node n holds ranks n * local_size .. (n + 1) * local_size - 1. Wrong for
    # -map-by node, and no launcher variable says which mapping was used.
    return rank // local_size, math.ceil(size / local_size)


def _from_variables(
    env: Mapping[str, str],
    launcher: str,
    rank: str,
    size: str,
    local_rank: str,
    local_size: str,
    node: tuple[str, str] | None = None,
    master_addr: str | None = None,
) -> ClusterInfo:
    """Read the variables a launcher names for rank, size, local rank, local size and (node rank, nodes)."""
    size_value = _count(env, size)
    rank_value = _index(env, rank, size_value, f"{size}={size_value}")
    local_size_value = _per_node(env, local_size, size_value, size)
    local_rank_value = _index(env, local_rank, local_size_value, f"{local_size}={local_size_value}")
    if node is None:
        node_rank, num_nodes = _derived_node(rank_value, size_value, local_size_value)
    else:
        num_nodes = _count(env, node[1])
        node_rank = _index(env, node[0], num_nodes, f"{node[1]}={num_nodes}")
    return ClusterInfo(
        rank=rank_value,
        size=size_value,
        local_rank=local_rank_value,
        local_size=local_size_value,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr or None,
        launcher=launcher,
    )


class Horovodrun:
    """``horovodrun --gloo``; ``horovodrun --mpi`` goes through mpirun and shows up as Open MPI."""

    name = "horovodrun"

    def detected(self, env: Mapping[str, str]) -> bool:
        return "HOROVOD_RANK" in env

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        # HOROVOD_CROSS_RANK numbers the hosts that run a process with this local rank: the node index as
        # long as every host has the same number of slots.
        return _from_variables(
            env,
            self.name,
            "HOROVOD_RANK",
            "HOROVOD_SIZE",
            "HOROVOD_LOCAL_RANK",
            "HOROVOD_LOCAL_SIZE",
            node=("HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"),
            master_addr=env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
        )


class OpenMPI:
    """Open MPI's mpirun. OMPI_COMM_WORLD_NODE_RANK is not the node index, despite its name."""

    name = "openmpi"

    def detected(self, env: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_RANK" in env

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        return _from_variables(
            env,
            self.name,
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )


class Mpich:
    """The hydra mpiexec of MPICH and Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS."""

    name = "mpich"

    def detected(self, env: Mapping[str, str]) -> bool:
        return "PMI_RANK" in env

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        local = ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")
        if "MPI_LOCALNRANKS" not in env and "PMI_LOCAL_SIZE" in env:
            local = ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")
        return _from_variables(env, self.name, "PMI_RANK", "PMI_SIZE", *local)


class SingleProcess:
    """No launcher: one process, rank 0 of 1."""

    name = "single"

    def detected(self, env: Mapping[str, str]) -> bool:
        return True

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        return ClusterInfo(0, 1, 0, 1, 0, 1, None, self.name)


def _torch_style(env: Mapping[str, str], launcher: str) -> ClusterInfo:
    """RANK, WORLD_SIZE, LOCAL_RANK and NODE_RANK, as Azure ML's PyTorch distribution sets them."""
    size = _count(env, "WORLD_SIZE")
    rank = _index(env, "RANK", size, f"WORLD_SIZE={size}")
    # Azure ML documents no per-node count for this mode: take torchrun's LOCAL_WORLD_SIZE or the node count
    # the Azure ML runtime exports, and assume one node only when nothing says there are several.
    if "LOCAL_WORLD_SIZE" in env:
        local_size = _per_node(env, "LOCAL_WORLD_SIZE", size, "WORLD_SIZE")
    elif "AZUREML_NODE_COUNT" in env:
        nodes = _count(env, "AZUREML_NODE_COUNT")
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
    local_rank = _index(env, "LOCAL_RANK", local_size, f"{local_size} processes per node")
    node_rank, num_nodes = _derived_node(rank, size, local_size)
    if "NODE_RANK" in env:
        node_rank = _index(env, "NODE_RANK", num_nodes, f"{num_nodes} nodes")
    return ClusterInfo(
        rank, size, local_rank, local_size, node_rank, num_nodes, env.get("MASTER_ADDR") or None, launcher
    )


def _azureml_master_addr(env: Mapping[str, str]) -> str | None:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    if env.get("AZ_BATCH_MASTER_NODE"):
        # "10.0.0.4:6000"; the port is Azure Batch's own (its docs say not to use it for MPI or NCCL).
        address, _, port = env["AZ_BATCH_MASTER_NODE"].rpartition(":")
        if not address or not port.isdigit():
            raise ValueError(f"AZ_BATCH_MASTER_NODE={env['AZ_BATCH_MASTER_NODE']!r} is not 'address:port'")
        return address
    return env.get("AZ_BATCHAI_MPI_MASTER_NODE") or None


_INNER_LAUNCHERS: tuple[ClusterEnvironment, ...] = (Horovodrun(), OpenMPI(), Mpich())


class AzureML:
    """An Azure ML job: ranks from the MPI or PyTorch launcher Azure ML ran, master address from Azure."""

    name = "azureml"
    # Plain Azure Batch multi-instance tasks set AZ_BATCH_MASTER_NODE too; their ranks come out right as well.
    MARKERS = ("AZUREML_RUN_ID", "AZ_BATCHAI_MPI_MASTER_NODE", "AZ_BATCH_MASTER_NODE")

    def detected(self, env: Mapping[str, str]) -> bool:
        return any(marker in env for marker in self.MARKERS)

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        inner = next((launcher for launcher in _INNER_LAUNCHERS if launcher.detected(env)), None)
        if inner is not None:
            info = inner.describe(env)
        elif "WORLD_SIZE" in env:
            info = _torch_style(env, self.name)
        else:
            info = SingleProcess().describe(env)
        return replace(info, launcher=self.name, master_addr=_azureml_master_addr(env) or info.master_addr)


# Azure ML first because it wraps another launcher's variables; a single process is the fallback.
ENVIRONMENTS: tuple[ClusterEnvironment, ...] = (AzureML(), *_INNER_LAUNCHERS, SingleProcess())


def detect_cluster(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """Describe this process's place in the job from ``env`` (default ``os.environ``) and nothing else."""
    env = os.environ if env is None else env
    environment = next(environment for environment in ENVIRONMENTS if environment.detected(env))
    return environment.describe(env)
