"""Horovod start-up and a data-parallel `train_step` for Keras 3's `model.fit`.

`data_parallel(model)` replaces the model's train_step (which `fit` compiles into a tf.function) with one
that averages the gradients over all ranks in one grouped allreduce before the optimizer applies them.
It is a train_step, not a DistributedOptimizer wrapper, because only the step sees its batch: the exact
mean over an uneven last step needs each rank's loss weighted by its share of the step's samples, and a
rank without samples must not run its forward pass (BatchNorm statistics), while Keras's optimizer only
ever receives gradients. (Wrapping each optimizer class would also need a dynamically built subclass.)
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdazure.core.backend import horovod_controller, refuse_adasum_without_mpi
from hvdazure.tensorflow.collectives import init_horovod
from hvdazure.tensorflow.gradients import allreduce_gradients, allreduce_options, dense_gradients
from hvdazure.tensorflow.sync_batchnorm import has_sync_batchnorm

# The dict key under which shard_for_fit's batches carry the number of samples in the whole optimizer step.
STEP_SAMPLES = "hvdazure_step_samples"


def init() -> None:
    """Start Horovod and place this rank (hvdazure.tensorflow.collectives.init_horovod): one GPU per local
    rank, or on CPU TensorFlow's threads limited to the rank's share of the cores. Call it first, before
    building a model: TensorFlow fixes its devices and threads when it runs its first operation."""
    init_horovod()


def data_parallel(model: keras.Model, *, reduce_op: str = "average", compression: str = "none",
                  gradient_predivide_factor: float = 1.0) -> keras.Model:
    """Make `model.fit` data-parallel: every step's gradients are allreduced over all ranks (one grouped
    allreduce; TrainConfig's `reduce_op`, `compression` and `gradient_predivide_factor`, with the same
    meaning) before the optimizer applies them, so the optimizer's own `global_clipnorm` clips the averaged
    gradients. Call before or after `compile` (with `jit_compile=False`: Horovod's ops cannot run in XLA).
    Returns `model`.

    Batches from `shard_for_fit` get the exact step mean: each rank's loss is weighted by its share of the
    step's samples, and a rank left without samples in a short last step runs no forward pass but still
    joins the allreduce with zeros. Other datasets get Horovod's plain average of the ranks' gradients."""
    refuse_adasum_without_mpi(reduce_op, horovod_controller(hvd))  # not at the first step, on every rank
    allreduce_args = allreduce_options(reduce_op, compression, gradient_predivide_factor)
    ranks_averaged = 1 if reduce_op == "sum" else hvd.size()
    model.train_step = DataParallelStep(model, allreduce_args, ranks_averaged,
                                        forward_empty=hvd.size() > 1 and has_sync_batchnorm(model))
    model.train_function = None  # a train function made before holds the old step
    return model


class DataParallelStep:
    """The train_step `data_parallel` installs: Keras's own step (forward pass, compiled loss and metrics,
    loss scaling) with a weighted loss, a skipped forward pass on an empty batch, and the allreduce."""

    def __init__(self, model: keras.Model, allreduce_args: dict[str, Any], ranks_averaged: int,
                 forward_empty: bool = False) -> None:
        self.model, self.allreduce_args, self.ranks_averaged = model, allreduce_args, ranks_averaged
        self.forward_empty = forward_empty  # SyncBatchNormalization layers: every rank runs every forward

    def __call__(self, data: Any) -> dict[str, Any]:
        model = self.model
        if model.jit_compile:  # raised while fit traces the step, identically on every rank
            raise ValueError("data_parallel: compile the model with jit_compile=False (Horovod's allreduce "
                             "cannot run inside an XLA-compiled train step)")
        step_samples = None
        if isinstance(data, dict) and STEP_SAMPLES in data:
            data, step_samples = data["batch"], data[STEP_SAMPLES]
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        variables = model.trainable_variables

        def forward_and_backward() -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
                if self.forward_empty:  # the loss of no samples may be NaN; it must count for nothing
                    loss = tf.where(rows > 0, loss, tf.zeros_like(loss))
                model._loss_tracker.update_state(loss, sample_weight=rows)  # as Keras's own train_step does
                weighted = loss * tf.cast(self._loss_weight(rows, step_samples), loss.dtype)
                scaled = model.optimizer.scale_loss(weighted)
            model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
            return dense_gradients(tape.gradient(scaled, variables), variables)

        def no_samples() -> list[tf.Tensor]:
            return [tf.zeros_like(v) for v in variables]

        if self.forward_empty:  # the layers' allreduces need every rank, samples or not
            gradients = forward_and_backward()
        else:
            gradients = tf.cond(rows > 0, forward_and_backward, no_samples)
        gradients = allreduce_gradients(gradients, self.allreduce_args)
        model.optimizer.apply(gradients, variables)
        return model.get_metrics_result()

    def _loss_weight(self, rows: tf.Tensor, step_samples: tf.Tensor | None) -> tf.Tensor:
        """This rank's share of the step's samples, times what the allreduce divides by (MicroBatch's
        loss_weight, computed in the graph): exactly 1.0 for a full step."""
        if step_samples is None:
            return tf.constant(1.0, tf.float64)
        return (tf.cast(rows * self.ranks_averaged, tf.float64)
                / tf.cast(step_samples, tf.float64))
