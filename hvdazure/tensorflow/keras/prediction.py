"""`predict(model, data, batch_size)`: Keras's `model.predict` over all ranks, exact, in dataset order.

Each rank predicts a contiguous run of the set's batches (core/predictions.py: the same batches at any
world size) with Keras's own `predict_on_batch`, and the ranks' outputs are joined in rank order, which is
dataset order: every sample once, nothing padded, on every rank.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np

from hvdazure.core.backend import DataError
from hvdazure.core.predictions import (
    Outputs,
    checked_outputs,
    gather_in_order,
    join_batches,
    prediction_batches,
)
from hvdazure.tensorflow.collectives import TensorFlowCollectives
from hvdazure.tensorflow.data import data_view, output_as_numpy


def predict(model: keras.Model, data: Any, batch_size: int) -> Outputs:
    """`model`'s predictions for every sample of `data`, in its order, on every rank (call it on every
    rank, after `init()`): one NumPy array with a row per sample, or a dict of them for a model with named
    outputs. `data`: the inputs only (what `model.predict` takes: an array, a dict or tuple of arrays, a
    finite unbatched tf.data Dataset of them, or a ShardedDataset whose samples decode to them).
    `batch_size` is per rank; each batch holds the same samples at any world size."""
    view = data_view(data, "predict(data)")
    if not len(view):
        raise DataError("predict(data): the data holds no samples")
    batches = prediction_batches(len(view), batch_size, hvd.size(), hvd.rank())
    if batches:
        view.read_ahead(np.arange(batches[0].start, batches[-1].stop))  # sharded: its first shards, now
    outputs = checked_outputs("the model", (model.predict_on_batch(view.take(b)) for b in batches), batches,
                              output_as_numpy)
    return gather_in_order(join_batches("the model", outputs), TensorFlowCollectives().allgather_bytes,
                           len(view))
