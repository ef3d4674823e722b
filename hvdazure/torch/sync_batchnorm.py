"""Synchronized BatchNorm on Horovod's collectives: training statistics of the whole micro-batch, all ranks
together, weighted by each rank's sample count, so that N ranks x b normalise as 1 process x N*b does.

Why our own and not `horovod.torch.SyncBatchNorm`: Horovod's runs only on CUDA, and combines per-rank means
and inverse deviations, which a rank without samples (the short last step of hvdazure's exact plan) has
none of. Here every rank sends its count, mean and variance per channel in one allgather, and each rank
combines them weighted by the counts (a rank with no samples has weight 0 and changes nothing); unlike
sums of squares, this keeps the variance accurate in float32 when the mean is large. The backward pass
sums the per-channel gradient terms over the ranks in one more allreduce (the input gradient depends on
every rank's samples through the statistics); the weight and bias gradients stay local, for the
optimizer's gradient allreduce.

Every rank must run a layer's forward pass for the same micro-batches: TorchBackend gives a rank without
samples an empty batch then (see TorchBackend.run_step). The collectives are named after the layer, so
ranks meet in the right layer whatever else they do in between.
"""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from torch.nn.modules.batchnorm import _BatchNorm


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over all ranks' samples of the micro-batch in training, for inputs (N, C, ...) of any rank
    >= 2; evaluation is BatchNorm's. `sync_name` names its collectives (unique
    per layer: the module's path in the model, as `convert_sync_batchnorm` sets it). On one rank it is
    BatchNorm itself."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, sync_name: str = "layer",
                 batchnorm1d: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.sync_name = sync_name
        self.batchnorm1d = batchnorm1d  # made of a BatchNorm1d: (batch, features) inputs, 1 value a sample

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        # Only training synchronizes: ranks evaluate different numbers of batches (some none), so a layer
        # without running statistics normalises an evaluation batch by its own, as BatchNorm does.
        if not self.training or hvd.size() == 1:
            return super().forward(input)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self,
                                            f"hvdazure.sync_bn.{self.sync_name}")

    def _update_running_stats(self, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Move the running statistics as BatchNorm does (the unbiased variance; momentum None: the
        cumulative average), once per micro-batch with samples on some rank."""
        if not self.track_running_stats or self.running_mean is None:
            return
        assert self.running_var is not None and self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (count / (count - 1))
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


class _SyncBatchNormFunction(torch.autograd.Function):
    """y = weight * (x - mean) / sqrt(var + eps) + bias, with mean and var over every rank's x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                layer: SyncBatchNorm, name: str) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # statistics in float64 for a float64 model
        channels = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        xs = x.to(dtype)
        local_count = x.numel() // channels if channels else 0
        if local_count:  # this rank's moments, as BatchNorm computes them (no E[x^2] - E[x]^2 cancellation)
            local_var, local_mean = torch.var_mean(xs, dims, correction=0)
        else:
            local_var = local_mean = torch.zeros(channels, dtype=dtype, device=x.device)
        count_column = torch.full((1,), local_count, dtype=dtype, device=x.device)
        gathered = hvd.allgather(torch.cat([count_column, local_mean, local_var]).unsqueeze(0),
                                 name=f"{name}.forward")  # (ranks, 1 + 2 x channels)
        counts = gathered[:, :1]
        count = counts.sum()
        if count == 0:  # no rank has a sample in this micro-batch: nothing to normalise or to learn
            ctx.empty = True
            return x.clone()
        if count == 1:
            raise ValueError(f"SyncBatchNorm {layer.sync_name!r}: expected more than 1 value per channel "
                             "when training, all ranks together, got 1")
        ctx.empty = False
        # the ranks' moments combined by their counts (Chan et al.): the mean of the means, and the
        # variance as the ranks' variances plus the spread of their means around the global one
        means, variances = gathered[:, 1 : 1 + channels], gathered[:, 1 + channels :]
        mean = (counts * means).sum(0) / count
        var = (counts * (variances + (means - mean) ** 2)).sum(0) / count
        layer._update_running_stats(count, mean, var)
        invstd = torch.rsqrt(var + layer.eps)
        shape = [1, channels] + [1] * (x.dim() - 2)
        xhat = (xs - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(dtype).view(shape)
        if bias is not None:
            y = y + bias.to(dtype).view(shape)
        ctx.save_for_backward(xhat, weight, invstd, count)
        ctx.has_bias, ctx.name, ctx.shape, ctx.dims = bias is not None, name, shape, dims
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        if ctx.empty:
            return dy, None, None, None, None
        xhat, weight, invstd, count = ctx.saved_tensors
        shape, dims = ctx.shape, ctx.dims
        dys = dy.to(xhat.dtype)
        sum_dy, sum_dy_xhat = dys.sum(dims), (dys * xhat).sum(dims)  # this rank's share of the sums
        total = hvd.allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=hvd.Sum, name=f"{ctx.name}.backward")
        all_dy, all_dy_xhat = total[: len(sum_dy)] / count, total[len(sum_dy) :] / count
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        dx = (dys - all_dy.view(shape) - xhat * all_dy_xhat.view(shape)) * scale.view(shape)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(dy.dtype) if ctx.has_bias else None
        return dx.to(dy.dtype), grad_weight, grad_bias, None, None


def convert_sync_batchnorm(module: torch.nn.Module, prefix: str = "") -> torch.nn.Module:
    """`module` with every BatchNorm layer (1d, 2d, 3d) replaced by a SyncBatchNorm holding the same
    parameters and running statistics (the same state_dict keys: checkpoints load either way), named after
    its path in the model."""
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        converted = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats, sync_name=prefix or "bn",
                                  batchnorm1d=isinstance(module, torch.nn.BatchNorm1d))
        with torch.no_grad():
            if module.affine:
                converted.weight, converted.bias = module.weight, module.bias
            converted.running_mean, converted.running_var = module.running_mean, module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, convert_sync_batchnorm(child, f"{prefix}.{name}" if prefix else name))
    return converted


def has_sync_batchnorm(module: torch.nn.Module) -> bool:
    """Whether `module` holds a SyncBatchNorm layer (whose collectives every rank must join)."""
    return any(isinstance(m, SyncBatchNorm) for m in module.modules())
