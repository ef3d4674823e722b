"""This rank's part of the data for `model.fit` and `model.evaluate`, by the core's sample plan.

Training: epoch e is the permutation of (seed, e); optimizer step t takes the next global batch of it and
this rank its cell, so step t trains on the same samples at any world size, each sample exactly once per
epoch. Every rank gets the same number of steps. The last step of an epoch holds what is left, split as
evenly as the plan allows; a rank may be left with an empty batch, on which `data_parallel`'s train_step
runs no forward pass (it still joins the allreduce). Nothing is padded or repeated, so Keras's metrics
count each sample once, and each batch carries the step's sample count so that the train_step weights the
loss to the exact mean over the step.

Evaluation: a contiguous, unpadded slice of the set per rank; `MetricAverage` sums the metrics' states.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, NamedTuple

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdazure.core.sample_plan import SamplePlan, eval_range
from hvdazure.core.step_batches import EpochSteps
from hvdazure.tensorflow.data import ShardedData, data_view
from hvdazure.tensorflow.keras.training import STEP_SAMPLES


class FitData(NamedTuple):
    """What `model.fit` needs: pass both (`model.fit(d.dataset, steps_per_epoch=d.steps_per_epoch)`)."""

    dataset: tf.data.Dataset  # endless: epoch after epoch, each one exactly steps_per_epoch batches
    steps_per_epoch: int  # the same on every rank
    plan: SamplePlan  # this rank's plan, for inspection


def shard_for_fit(data: Any, batch_size: int, seed: int = 0, initial_epoch: int = 0) -> FitData:
    """This rank's batches for `model.fit`, epoch after epoch from `initial_epoch` (pass fit's
    `initial_epoch` when resuming), by the core's exactly-once plan.

    `data`: the full, unsharded data in Keras's form, `(x, y)` or `(x, y, sample_weight)`, where each part
    is a NumPy array, a tensor or a dict/tuple of them sharing the first dimension; or a finite tf.data
    Dataset of such (unbatched) samples, read into memory once; or a hvdazure.data.ShardedDataset whose
    samples decode to that form, read a batch at a time (its own order: few shards per rank, and its next
    shards fetched ahead). `batch_size` is per rank.
    The dataset never ends: give fit `steps_per_epoch`, so that each Keras epoch is one epoch of the plan."""
    arrays = data_view(data, "shard_for_fit(data)")
    plan = SamplePlan(len(arrays), batch_size, hvd.size(), hvd.rank(), grad_accum_steps=1, seed=seed,
                     order=arrays.order)

    def batches() -> Iterator[dict[str, Any]]:
        for epoch in itertools.count(initial_epoch):
            for (cell,) in arrays.reading_ahead(EpochSteps(plan, epoch, 0).cursor()):
                yield {"batch": arrays.take(cell.indices), STEP_SAMPLES: np.int64(cell.step_samples)}

    signature = {"batch": arrays.signature(), STEP_SAMPLES: tf.TensorSpec((), tf.int64)}
    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature).prefetch(2)
    return FitData(dataset, plan.steps_per_epoch, plan)


def shard_for_evaluate(data: Any, batch_size: int) -> tf.data.Dataset:
    """This rank's contiguous slice of an evaluation set (sizes differ by at most one; nothing padded), in
    batches of `batch_size`, for fit's `validation_data` or `model.evaluate`; with `MetricAverage` among the
    callbacks the metrics are those of the whole set. A rank whose slice is empty (a set smaller than the
    world size) gets one empty batch, which adds nothing to any metric. A ShardedDataset is read a batch
    at a time, through a prefetching pipeline."""
    arrays = data_view(data, "shard_for_evaluate(data)")
    mine = eval_range(len(arrays), hvd.size(), hvd.rank())
    if isinstance(arrays, ShardedData):
        starts = range(mine.start, mine.stop, batch_size) if mine else range(mine.start, mine.start + 1)

        def batches() -> Iterator[Any]:
            arrays.dataset.read_ahead(np.arange(mine.start, mine.stop))
            for start in starts:
                yield arrays.take(range(start, min(start + batch_size, mine.stop)))

        pipeline = tf.data.Dataset.from_generator(batches, output_signature=arrays.signature())
        return pipeline.apply(tf.data.experimental.assert_cardinality(len(starts))).prefetch(2)
    if not mine:
        return tf.data.Dataset.from_tensors(arrays.take([]))
    return tf.data.Dataset.from_tensor_slices(arrays.take(mine)).batch(batch_size)
