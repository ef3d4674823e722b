"""The launchers that start ranks on any machine: horovodrun (Gloo), Open MPI, MPICH / Intel MPI, or none.

Each reads the variables its launcher sets. On their own they keep no storage after the job (no default
checkpoint directory) and announce a preemption by SIGTERM alone, which every rank handles itself
(core/stop_signals.py): they watch for no advance notice unless asked to.
"""

from __future__ import annotations

from collections.abc import Mapping

from hvdazure.core.environments.environment import (
    ClusterInfo,
    PreemptionNotices,
    home_cache_dir,
    node_of_rank,
    read_count,
    read_index,
    read_per_node,
)


def from_variables(
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
    size_value = read_count(env, size)
    rank_value = read_index(env, rank, size_value, f"{size}={size_value}")
    local_size_value = read_per_node(env, local_size, size_value, size)
    local_rank_value = read_index(env, local_rank, local_size_value, f"{local_size}={local_size_value}")
    if node is None:
        node_rank, num_nodes = node_of_rank(rank_value, size_value, local_size_value)
    else:
        num_nodes = read_count(env, node[1])
        node_rank = read_index(env, node[0], num_nodes, f"{node[1]}={num_nodes}")
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


class Launcher:
    """What a plain launcher decides: no checkpoints unless configured, preemption notices only if asked."""

    def default_checkpoint_dir(self) -> str | None:
        return None

    def job_id(self, env: Mapping[str, str]) -> str | None:
        return None  # a plain launcher does not run a job again by itself

    def default_cache_dir(self, env: Mapping[str, str]) -> str:
        return home_cache_dir(env)

    def preemption_notices(self, watch: bool | None, notices_url: str | None) -> PreemptionNotices | None:
        if not watch:
            return None
        # Asked for anyway: the one advance notice hvdazure reads is the instance metadata service's
        # Scheduled Events, which Azure VMs have outside Azure ML too (mpirun on a VM scale set).
        from hvdazure.core.environments.scheduled_events import ScheduledEventsNotices  # urllib: when asked

        return ScheduledEventsNotices(notices_url)


class Horovodrun(Launcher):
    """``horovodrun --gloo``; ``horovodrun --mpi`` goes through mpirun and shows up as Open MPI."""

    name = "horovodrun"

    def detected(self, env: Mapping[str, str]) -> bool:
        return "HOROVOD_RANK" in env

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        # HOROVOD_CROSS_RANK numbers the hosts that run a process with this local rank: the node index as
        # long as every host has the same number of slots.
        return from_variables(
            env,
            self.name,
            "HOROVOD_RANK",
            "HOROVOD_SIZE",
            "HOROVOD_LOCAL_RANK",
            "HOROVOD_LOCAL_SIZE",
            node=("HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"),
            master_addr=env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
        )


class OpenMPI(Launcher):
    """Open MPI's mpirun. OMPI_COMM_WORLD_NODE_RANK is not the node index, despite its name."""

    name = "openmpi"

    def detected(self, env: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_RANK" in env

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        return from_variables(
            env,
            self.name,
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )


class Mpich(Launcher):
    """The hydra mpiexec of MPICH and Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS."""

    name = "mpich"

    def detected(self, env: Mapping[str, str]) -> bool:
        return "PMI_RANK" in env

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        local = ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")
        if "MPI_LOCALNRANKS" not in env and "PMI_LOCAL_SIZE" in env:
            local = ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")
        return from_variables(env, self.name, "PMI_RANK", "PMI_SIZE", *local)


class SingleProcess(Launcher):
    """No launcher: one process, rank 0 of 1."""

    name = "single"

    def detected(self, env: Mapping[str, str]) -> bool:
        return True

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        return ClusterInfo(0, 1, 0, 1, 0, 1, None, self.name)
