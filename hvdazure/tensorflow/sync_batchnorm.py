"""Synchronized BatchNormalization for Keras 3 on horovod.tensorflow: training statistics of the whole
micro-batch, all ranks together, weighted by each rank's sample count, so that N ranks x b normalise as
1 process x N*b does.

Why our own: Horovod's `hvd.SyncBatchNormalization` passes `fused=False`, which Keras 3's layer refuses.
Here every rank sends its count, mean and variance per channel in one allgather and each combines them
weighted by the counts (a rank with no samples has weight 0 and changes nothing; unlike Keras's own
synchronized moments, from sums of squares, this keeps the variance accurate in float32 far from zero);
the gradient flows back through that allgather as the sum of the ranks' gradients (one allreduce), so
the input gradient sees every rank's samples. The
moving statistics are updated as Keras's BatchNormalization updates them, from the same global moments.

Every rank must run the layer for the same micro-batches: TensorFlowTrainer and `hk.data_parallel` give a
rank without samples an empty batch then. The allgather is named after the layer, free of name scopes, so
ranks meet in the same layer whichever compiled step they run it in.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdazure.tensorflow.gradients import not_converted


@keras.saving.register_keras_serializable(package="hvdazure")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose training statistics are over every rank's samples (one
    allgather per call in training); the same arguments, weights and inference behaviour."""

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        """Keras's hook for the training moments (BatchNormalization.call updates the moving ones)."""
        if hvd.size() == 1:
            return super()._moments(inputs, mask)
        return self.synchronized_moments(inputs, mask)

    def synchronized_moments(self, inputs: Any, mask: Any = None) -> tuple[Any, Any]:
        """Mean and (biased) variance per channel over every rank's samples (one allgather)."""
        x = tf.convert_to_tensor(inputs)
        weights = tf.ones_like(x) if mask is None else tf.broadcast_to(
            tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
        axes = self._reduction_axes  # every axis but the channels' (Keras's own, set in build)
        channels = x.shape[self.axis]
        broadcast = [1] * len(x.shape)
        broadcast[self.axis] = channels
        local_count = tf.reduce_sum(weights, axes)[:1]  # per channel, all equal
        local_safe = tf.maximum(local_count, 1)  # a rank without samples: mean and variance 0, weight 0
        local_mean = tf.reduce_sum(x * weights, axes) / local_safe
        centred = x - tf.reshape(local_mean, broadcast)
        local_variance = tf.reduce_sum(centred * centred * weights, axes) / local_safe
        gathered = _gather_rows(tf.concat([local_count, local_mean, local_variance], 0)[tf.newaxis],
                                f"hvdazure.sync_bn.{self.name}")
        counts = gathered[:, :1]  # (ranks, 1): every rank's count, mean and variance, in rank order
        means, variances = gathered[:, 1 : 1 + channels], gathered[:, 1 + channels :]
        count = tf.reduce_sum(counts)
        # No sample on any rank (an empty micro-batch of a short last step, everywhere): the moving
        # statistics must stay as they are, so the moments are the moving ones.
        has_samples = count > 0
        safe = tf.maximum(count, 1)
        # combined by the counts (Chan et al.), not from sums of squares: accurate in float32 far from 0
        mean = tf.reduce_sum(counts * means, 0) / safe
        variance = tf.reduce_sum(counts * (variances + tf.square(means - mean)), 0) / safe
        mean = tf.where(has_samples, mean, tf.cast(self.moving_mean, x.dtype))
        variance = tf.where(has_samples, variance, tf.cast(self.moving_variance, x.dtype))
        return mean, variance


@not_converted
def _gather_rows(row: Any, name: str) -> Any:
    """Every rank's `row` (1, n), stacked in rank order (ranks, n). Differentiated as the allreduce of
    count, sum and sum of squares was: every rank's loss depends on every row, so a row's gradient is the
    sum of the ranks' gradients for it (Horovod's own allgather gradient averages them instead)."""

    @tf.custom_gradient
    def gather(x: Any) -> Any:
        def gradient(upstream: Any) -> Any:
            total = hvd.allreduce(upstream, op=hvd.Sum, name=f"{name}.backward", ignore_name_scope=True)
            return total[hvd.rank()][tf.newaxis]

        return hvd.allgather(x, name=name, ignore_name_scope=True), gradient

    return gather(row)


def has_sync_batchnorm(model: keras.Model) -> bool:
    """Whether `model` holds a SyncBatchNormalization layer (whose allgather every rank must join)."""
    return any(isinstance(layer, SyncBatchNormalization) for layer in _layers(model))


def convert_sync_batchnorm(model: keras.Model) -> keras.Model:
    """`model` with every keras.layers.BatchNormalization made a SyncBatchNormalization (its class only:
    the layer, its weights and its configuration stay); returns `model`."""
    for layer in _layers(model):
        if type(layer) is keras.layers.BatchNormalization:
            layer.__class__ = SyncBatchNormalization
    return model


def _layers(model: keras.Model) -> list[Any]:
    """Every layer inside `model`, nested ones too (Keras's own walk; `model.layers` is the top level)."""
    return list(model._flatten_layers(include_self=False, recursive=True))
