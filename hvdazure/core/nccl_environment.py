"""NCCL's environment: the variables hvdazure sets for NCCL, decided here for every way a job starts
(`hvdazure run`: launch/command.py; Azure ML jobs: azure/vm_sizes.py for `hvdazure submit`).

- NCCL_SOCKET_IFNAME: the interface hvdazure already chose for the traffic between nodes (Gloo's and MPI's:
  launch/network.py; eth0 on Azure VMs), so that NCCL's bootstrap and socket transport take the same road.
  Left alone, NCCL takes the first interface it likes, which can be a container bridge or a storage network
  that the other nodes cannot reach: a hang at the first allreduce.
- NCCL_IB_DISABLE=1 only where the machines are known to have no InfiniBand (an Azure VM size without it):
  NCCL then skips the probe. Where there may be InfiniBand, NCCL probes and uses it, as it should; a launcher
  cannot see the other nodes' hardware.
- NCCL_DEBUG=WARN: without it NCCL prints nothing at all, not even why it failed; WARN prints its warnings
  and errors only (INFO, once, shows which transport it picked).

Variables the environment already sets are the user's choice: they are never overwritten (only the missing
ones are returned), and hvdazure adds nothing where the user chose.
"""

from __future__ import annotations

from collections.abc import Mapping

NCCL_DEBUG_DEFAULT = "WARN"


def nccl_environment(env: Mapping[str, str], interface: str | None = None,
                     infiniband: bool | None = None) -> dict[str, str]:
    """The NCCL variables to add to `env`: NCCL_DEBUG, NCCL_SOCKET_IFNAME when `interface` (the interface
    between nodes) is known, NCCL_IB_DISABLE when `infiniband` is known to be False; those `env` sets left
    out."""
    wanted = {"NCCL_DEBUG": NCCL_DEBUG_DEFAULT}
    if interface:
        wanted["NCCL_SOCKET_IFNAME"] = interface
    if infiniband is False:
        wanted["NCCL_IB_DISABLE"] = "1"
    return {name: value for name, value in wanted.items() if name not in env}
