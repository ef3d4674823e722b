"""What hvdazure knows about common Azure GPU VM sizes: GPUs per VM, and whether the size has InfiniBand.

Used for two defaults of `hvdazure submit`: the processes per node (one per GPU) when the compute's size is
known, and the NCCL settings for the size (docs/guides/docker.md, "NCCL and InfiniBand settings"). A size that
is not in the table is fine: processes per node must then be given, and only the settings that hold for
every Azure VM are added.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdazure.core.nccl_environment import nccl_environment as core_nccl_environment


@dataclass(frozen=True)
class VmSize:
    name: str
    gpus: int
    infiniband: bool


_SIZES = [
    # ND: multi-GPU sizes with InfiniBand ("r" in the name) for multi-node training
    VmSize("Standard_ND40rs_v2", 8, True),  # V100 32 GB
    VmSize("Standard_ND96asr_v4", 8, True),  # A100 40 GB (ND A100 v4)
    VmSize("Standard_ND96amsr_A100_v4", 8, True),  # A100 80 GB (NDm A100 v4)
    VmSize("Standard_ND96isr_H100_v5", 8, True),  # H100 (ND H100 v5)
    VmSize("Standard_ND96isr_H200_v5", 8, True),  # H200 (ND H200 v5)
    # NC: one to four GPUs per VM; only NC24rs_v3 has InfiniBand
    VmSize("Standard_NC6s_v3", 1, False),  # V100 16 GB
    VmSize("Standard_NC12s_v3", 2, False),
    VmSize("Standard_NC24s_v3", 4, False),
    VmSize("Standard_NC24rs_v3", 4, True),
    VmSize("Standard_NC4as_T4_v3", 1, False),  # T4
    VmSize("Standard_NC8as_T4_v3", 1, False),
    VmSize("Standard_NC16as_T4_v3", 1, False),
    VmSize("Standard_NC64as_T4_v3", 4, False),
    VmSize("Standard_NC24ads_A100_v4", 1, False),  # A100 80 GB (NC A100 v4)
    VmSize("Standard_NC48ads_A100_v4", 2, False),
    VmSize("Standard_NC96ads_A100_v4", 4, False),
    VmSize("Standard_NC40ads_H100_v5", 1, False),  # H100 NVL
    VmSize("Standard_NC80adis_H100_v5", 2, False),
]
_BY_NAME = {size.name.lower(): size for size in _SIZES}


def lookup(vm_size: str | None) -> VmSize | None:
    """The size's entry, matched case-insensitively (the service reports names in upper case), or None."""
    return _BY_NAME.get(vm_size.lower()) if vm_size else None


def known_sizes() -> list[str]:
    return [size.name for size in _SIZES]


def nccl_environment(vm_size: str | None) -> dict[str, str]:
    """NCCL and UCX settings for the size: NCCL's own as core/nccl_environment.py decides them for an Azure
    VM (eth0 between nodes, InfiniBand as the size has it), and what docs/guides/docker.md advises besides,
    without NCCL_TOPO_FILE (the file must be visible in the container first). Every value here can be
    overridden with `--env`."""
    size = lookup(vm_size)
    # every Azure VM: bootstrap over eth0, not ib* or docker0; no InfiniBand probe on a size without it
    env = core_nccl_environment({}, "eth0", size.infiniband if size is not None else None)
    if size is None:
        return env
    if size.infiniband:
        env.update(NCCL_IB_PCI_RELAXED_ORDERING="1", UCX_IB_PCI_RELAXED_ORDERING="on")
    if size.name.startswith("Standard_ND"):
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # GPU numbering that matches the topology
    return env
