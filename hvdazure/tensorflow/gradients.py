"""The gradient allreduce of one optimizer step on horovod.tensorflow, shared by TensorFlowTrainer and the
Keras `model.fit` integration (hvdazure.tensorflow.keras)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdazure.core.config import ConfigError

OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}
COMPRESSION = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}


def allreduce_options(reduce_op: str = "average", compression: str = "none",
                      gradient_predivide_factor: float = 1.0) -> dict[str, Any]:
    """Horovod's arguments for TrainConfig's `reduce_op`, `compression` and `gradient_predivide_factor`
    (the averaging split before and after the sum, as Horovod's DistributedGradientTape does)."""
    if reduce_op not in OPS:
        raise ValueError(f"reduce_op must be one of {sorted(OPS)}, got {reduce_op!r}")
    if compression not in COMPRESSION:
        raise ValueError(f"compression must be one of {sorted(COMPRESSION)}, got {compression!r}")
    if gradient_predivide_factor <= 0 or (reduce_op != "average" and gradient_predivide_factor != 1.0):
        raise ValueError(f"gradient_predivide_factor {gradient_predivide_factor!r} must be positive, and 1.0 "
                         "unless reduce_op is 'average'")
    options: dict[str, Any] = {"op": OPS[reduce_op], "compression": COMPRESSION[compression]}
    if gradient_predivide_factor != 1.0:
        options.update(prescale_factor=1.0 / gradient_predivide_factor,
                       postscale_factor=gradient_predivide_factor)
    return options


def refuse_zero_stage(zero_stage: int, use: str) -> None:
    """A ConfigError, before training, for `zero_stage` > 0: sharded optimizer state is built for PyTorch
    only (hvdazure/torch/zero.py), and quietly keeping the whole state on every rank would hand a user who
    asked for sharding the memory use they meant to avoid. `use`: what stage 0 is to be used with
    (TensorFlowTrainer, model.fit)."""
    if zero_stage:
        raise ConfigError(f"config field 'zero_stage': {zero_stage!r}: sharded optimizer state is "
                          f"PyTorch-only for now; use zero_stage: 0 with {use}")


# AutoGraph would convert Horovod's Python functions on the first trace of every compiled step that calls
# them (about a second of the time to the first step, for nothing: they have no tensor-dependent control
# flow); functions marked so are called as they are. Used on hvdazure's own functions that call no user code.
not_converted = tf.autograph.experimental.do_not_convert


@not_converted
def allreduce_gradients(gradients: Sequence[tf.Tensor], options: dict[str, Any]) -> list[tf.Tensor]:
    """One grouped allreduce of the step's gradients (nothing to do on one rank).

    Horovod pairs the ranks' collectives by name, and names an unnamed one after its input tensors and name
    scope: ranks that reach it from different compiled functions (a rank without samples in a short last
    step runs no forward pass) would wait for each other forever. The name is fixed and free of scopes."""
    if hvd.size() == 1:
        return list(gradients)
    return hvd.grouped_allreduce(list(gradients), name="hvdazure.gradients", ignore_name_scope=True,
                                 **options)


def dense_gradients(gradients: Sequence[Any], variables: Sequence[Any]) -> list[tf.Tensor]:
    """Dense gradients for the allreduce: zeros for a variable the loss does not reach (another rank's loss
    may), dense values for an embedding's IndexedSlices."""
    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(gradients, variables, strict=True)]
