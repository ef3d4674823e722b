"""Which device a rank trains on: one decision, from numbers a binding reads off its framework.

Horovod's rule is one GPU per rank, and the rank's local rank (its index on its node) picks it. The policy,
for `local_size` ranks on a node that see `visible` GPUs (counted within CUDA_VISIBLE_DEVICES when it is set):

1. No GPU visible: the CPU.
2. At least as many GPUs as ranks: local rank i takes GPU i (`cuda:i`). GPUs beyond the ranks stay idle, and
   the layout line says so (a node of 8 GPUs running 4 ranks is usually a mistake in `-np`).
3. One GPU visible: GPU 0. Either the launcher gives each rank its own GPU (CUDA_VISIBLE_DEVICES set per
   rank, as Slurm and per-rank wrappers do), or the node has one GPU that its ranks share (NCCL refuses two
   ranks of one communicator on one GPU; Horovod's CPU operations do not mind).
4. More than one GPU but fewer than the ranks: an error on every rank, naming the numbers and the fix. Ranks
   doubled up on some GPUs while others have one each is never what was meant, and it ends in an NCCL error
   or an out-of-memory far from its cause.

The bindings (torch/backend.py, tensorflow/collectives.py) ask `place_rank` and apply its answer
(torch.cuda.set_device; tf.config.set_visible_devices); rank 0 logs `Placement.layout`, one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdazure.core.errors import UserError


class DevicePlacementError(UserError, ValueError):
    """The node's ranks and visible GPUs cannot be paired one to one."""


@dataclass(frozen=True)
class Placement:
    """Where a rank trains: `index` is its GPU among those visible to it (cuda:index), None for the CPU.
    `local_size` and `visible` are what the decision was made from, for the layout line."""

    index: int | None
    local_size: int
    visible: int
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES as the rank saw it; None: not set

    @property
    def on_gpu(self) -> bool:
        return self.index is not None

    def layout(self, size: int, nodes: int) -> str:
        """The job's layout as rank 0 sees it, e.g. `4 ranks on 1 node, 1 GPU each (cuda:0..3)` or
        `2 ranks on 1 node, CPU`; `size` ranks in all on `nodes` nodes."""
        ranks = f"{size} rank{'s' if size != 1 else ''} on {nodes} node{'s' if nodes != 1 else ''}"
        if nodes > 1:
            ranks += f" ({self.local_size} per node)"
        if self.index is None:
            return f"{ranks}, CPU"
        if self.visible == 1 and self.local_size > 1:
            if self.visible_devices is None:
                return (f"{ranks}, sharing the node's 1 GPU (cuda:0; NCCL needs a GPU per rank, Horovod's "
                        "CPU operations do not)")
            return (f"{ranks}, 1 GPU each (each rank sees one: CUDA_VISIBLE_DEVICES={self.visible_devices} "
                    "on rank 0)")
        used = "cuda:0" if self.local_size == 1 else f"cuda:0..{self.local_size - 1}"
        if self.visible_devices is not None:
            used += f" of CUDA_VISIBLE_DEVICES={self.visible_devices}"
        idle = self.visible - self.local_size
        if idle:
            used += f"; {idle} of {self.visible} visible GPUs idle"
        return f"{ranks}, 1 GPU each ({used})"


def place_rank(local_rank: int, local_size: int, visible: int, visible_devices: str | None) -> Placement:
    """This rank's device by the policy above: local rank `local_rank` of `local_size` on a node, `visible`
    GPUs visible to it, `visible_devices` the CUDA_VISIBLE_DEVICES it was started with (None: unset).
    DevicePlacementError when the node's ranks cannot have a GPU each."""
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} is not one of {local_size} ranks per node")
    if visible <= 0:
        return Placement(None, local_size, 0, visible_devices)
    if visible == 1:
        return Placement(0, local_size, 1, visible_devices)
    if visible < local_size:
        shown = "unset" if visible_devices is None else visible_devices
        raise DevicePlacementError(
            f"{local_size} ranks per node but {visible} GPUs visible (CUDA_VISIBLE_DEVICES={shown}): ranks "
            f"cannot have a GPU each; run {visible} ranks per node (hvdazure run -np, hvdazure submit "
            "--processes-per-node, Azure ML's process_count_per_instance) or make a GPU per rank visible")
    return Placement(local_rank, local_size, visible, visible_devices)
