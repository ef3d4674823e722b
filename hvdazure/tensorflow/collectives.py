"""The core's collectives (core/backend.py) on `horovod.tensorflow`, in eager mode."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdazure.core.backend import Collectives, horovod_controller, split_rows
from hvdazure.core.devices import Placement, place_rank


class TensorFlowCollectives(Collectives):
    def __init__(self) -> None:
        super().__init__(hvd.rank(), hvd.size(), hvd.local_rank(), horovod_controller(hvd))

    def allgather_floats(self, values: Sequence[Any]) -> list[list[float]]:
        # Each row travels with its length in front, so one allgather of rows of any lengths suffices. Numbers
        # read on the host (see _metric_to_float64) make one constant, not three eager operations each.
        if all(isinstance(v, int | float) for v in values):
            row = tf.constant([len(values), *values], tf.float64)
        else:
            # a number made a float64 constant, not cast: tf.cast would make it a float32 tensor first
            row = tf.stack([tf.constant(float(len(values)), tf.float64),
                            *(tf.constant(float(v), tf.float64) if isinstance(v, int | float) else
                              tf.reshape(tf.cast(v, tf.float64), ()) for v in values)])
        joined = hvd.allgather(row, name="hvdazure.rows").numpy().tolist()
        return split_rows(joined)

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        size = int(hvd.broadcast(tf.constant([len(data) if data is not None else 0], tf.int64), 0,
                                 name="hvdazure.bytes.n").numpy()[0])
        if size == 0:
            return b""
        buffer = (tf.constant(np.frombuffer(data, np.uint8)) if data is not None
                  else tf.zeros([size], tf.uint8))
        return hvd.broadcast(buffer, 0, name="hvdazure.bytes").numpy().tobytes()

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        sizes = hvd.allgather(tf.constant([len(data)], tf.int64), name="hvdazure.gather.n").numpy().tolist()
        joined = hvd.allgather(tf.constant(np.frombuffer(data, np.uint8)), name="hvdazure.gather")
        blob = joined.numpy().tobytes()
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        return [blob[offsets[i] : offsets[i + 1]] for i in range(len(sizes))]


def init_horovod(comm: Any = None) -> bool:
    """`start_horovod`, answering whether this rank uses a GPU (for callers that need no more)."""
    return start_horovod(comm).on_gpu


def start_horovod(comm: Any = None) -> Placement:
    """Start Horovod (on an mpi4py communicator's ranks when given) and place this rank: its GPU as
    core/devices.py decides (the only one TensorFlow then sees, memory allocated as needed), or on CPU
    TensorFlow's threads limited to this rank's share of the node's cores unless OMP_NUM_THREADS or
    TF_NUM_INTRAOP_THREADS is set. Returns the placement. Call it before building a model: TensorFlow fixes
    its devices and threads when it runs its first operation (later, this changes nothing)."""
    hvd.init(comm=comm)
    gpus = tf.config.list_physical_devices("GPU")
    placement = place_rank(hvd.local_rank(), hvd.local_size(), len(gpus),
                           os.environ.get("CUDA_VISIBLE_DEVICES"))
    try:
        if placement.index is not None:
            tf.config.set_visible_devices(gpus[placement.index], "GPU")
            tf.config.experimental.set_memory_growth(gpus[placement.index], True)
        elif not {"OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"} & set(os.environ):
            share = max(1, len(os.sched_getaffinity(0)) // hvd.local_size())
            tf.config.threading.set_intra_op_parallelism_threads(share)
            tf.config.threading.set_inter_op_parallelism_threads(min(2, share))
    except RuntimeError:  # TensorFlow already ran an operation: its devices and threads are fixed
        pass
    return placement
