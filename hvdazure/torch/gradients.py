"""How a step's gradients are averaged across ranks on horovod.torch: during the backward pass, each as it
is produced (Horovod's DistributedOptimizer, whose hooks overlap the allreduces with the rest of backward:
right on GPUs, where the exchange runs beside the kernels), or after it, all in one grouped allreduce (as the
TensorFlow binding does: right on CPUs, where every core is already computing and an exchange in the middle
of backward only competes with it for them; `hvdazure bench peers` measures both)."""

from __future__ import annotations

from collections.abc import Iterable

import horovod.torch as hvd
import torch

OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}
COMPRESSION = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
NAME = "hvdazure.gradients"  # fixed: every rank's allreduce pairs with its peers' by name


def overlaps_backward(grad_allreduce: str, reduce_op: str, device: torch.device) -> bool:
    """Whether the gradients' allreduces run during backward: TrainConfig's `grad_allreduce`, where "auto"
    means on CUDA devices, and always for Adasum (only Horovod's DistributedOptimizer has it)."""
    if grad_allreduce == "auto":
        return device.type == "cuda" or reduce_op == "adasum"
    return grad_allreduce == "overlap"


class GradientsAfterBackward:
    """One grouped allreduce, in place, of the gradients of `params` (all of them, in the same order on
    every rank: zeros where this rank's loss did not reach a parameter, or where it had no samples), with
    the op, compression and predivide split Horovod's DistributedOptimizer would use."""

    def __init__(self, params: Iterable[torch.nn.Parameter], reduce_op: str, compression: str,
                 gradient_predivide_factor: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.op, self.compression = OPS[reduce_op], COMPRESSION[compression]
        self.scale: dict[str, float] = {}
        if reduce_op == "average" and gradient_predivide_factor != 1.0:
            # Horovod divides by the world size after the sum, on top of the postscale factor
            self.scale = {"prescale_factor": 1.0 / gradient_predivide_factor,
                          "postscale_factor": gradient_predivide_factor}

    def __call__(self) -> None:
        if hvd.size() == 1 or not self.params:
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        grads = [p.grad for p in self.params]
        if self.compression is hvd.Compression.none:
            hvd.grouped_allreduce_(grads, name=NAME, op=self.op, **self.scale)
            return
        compressed, contexts = zip(*(self.compression.compress(g) for g in grads), strict=True)
        reduced = hvd.grouped_allreduce(list(compressed), name=NAME, op=self.op, **self.scale)
        for grad, output, context in zip(grads, reduced, contexts, strict=True):
            grad.copy_(self.compression.decompress(output, context))
