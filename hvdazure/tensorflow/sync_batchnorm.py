"""Synchronized BatchNormalization for Keras 3 on horovod.tensorflow: training statistics of the whole
micro-batch, all ranks together, weighted by each rank's sample count, so that N ranks x b normalise as
1 process x N*b does.

Why our own: Horovod's `hvd.SyncBatchNormalization` passes `fused=False`, which Keras 3's layer refuses.
Here every rank sends its count, sum and sum of squares per channel in one allreduce (a rank with no
samples sends zeros and changes nothing); the gradient flows back through that allreduce, which Horovod
differentiates as a sum of the ranks' gradients, so the input gradient sees every rank's samples. The
moving statistics are updated as Keras's BatchNormalization updates them, from the same global moments.

Every rank must run the layer for the same micro-batches: TensorFlowTrainer and `hk.data_parallel` give a
rank without samples an empty batch then. The allreduce is named after the layer, free of name scopes, so
ranks meet in the same layer whichever compiled step they run it in.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="hvdazure")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose training statistics are over every rank's samples (one
    allreduce per call in training); the same arguments, weights and inference behaviour."""

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        """Keras's hook for the training moments (BatchNormalization.call updates the moving ones)."""
        if hvd.size() == 1:
            return super()._moments(inputs, mask)
        return self.synchronized_moments(inputs, mask)

    def synchronized_moments(self, inputs: Any, mask: Any = None) -> tuple[Any, Any]:
        """Mean and (biased) variance per channel over every rank's samples (one allreduce)."""
        x = tf.convert_to_tensor(inputs)
        weights = tf.ones_like(x) if mask is None else tf.broadcast_to(
            tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
        axes = self._reduction_axes  # every axis but the channels' (Keras's own, set in build)
        counts = tf.reduce_sum(weights, axes)  # per channel, all equal
        local = tf.concat([counts[:1], tf.reduce_sum(x * weights, axes),
                           tf.reduce_sum(x * x * weights, axes)], 0)
        total = hvd.allreduce(local, op=hvd.Sum, name=f"hvdazure.sync_bn.{self.name}",
                              ignore_name_scope=True)
        channels = x.shape[self.axis]
        count, sums, squares = total[0], total[1 : 1 + channels], total[1 + channels :]
        # No sample on any rank (an empty micro-batch of a short last step, everywhere): the moving
        # statistics must stay as they are, so the moments are the moving ones.
        has_samples = count > 0
        safe = tf.maximum(count, 1)
        mean = sums / safe
        variance = tf.maximum(squares / safe - mean * mean, 0)
        mean = tf.where(has_samples, mean, tf.cast(self.moving_mean, x.dtype))
        variance = tf.where(has_samples, variance, tf.cast(self.moving_variance, x.dtype))
        return mean, variance


def has_sync_batchnorm(model: keras.Model) -> bool:
    """Whether `model` holds a SyncBatchNormalization layer (whose allreduce every rank must join)."""
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
