"""The TensorFlow side of the throughput benchmark (a ThroughputSide): the same synthetic data and models as
throughput_torch.py (throughput_workload.py; channels last) on Keras 3, and TensorFlowTrainer with
BatchTimer, which times batches of steps after a warm-up. Imported in ranks only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdazure import Callback, TrainConfig
from hvdazure.bench.models_tf import build_model, sgd, synthetic_arrays
from hvdazure.bench.throughput_workload import BatchSchedule, BatchTimer, train_config
from hvdazure.tensorflow import TensorFlowTrainer
from hvdazure.tensorflow.collectives import init_horovod
from hvdazure.tensorflow.data import ArrayData


class CycledArrays(ArrayData):
    """`length` samples cycling through the few of `data`: the trainer's exact data plan over a dataset of
    any length, with no memory for it (a 224x224 dataset of every step's samples would take gigabytes)."""

    def __init__(self, data: Any, length: int) -> None:
        super().__init__(data, "synthetic data")
        self.distinct, self.num_samples = self.num_samples, length

    def take(self, indices: Sequence[int]) -> Any:
        return super().take(cast(Sequence[int], np.asarray(indices, dtype=np.int64) % self.distinct))


class SyntheticTrainer(TensorFlowTrainer):
    def __init__(self, config: TrainConfig, model: str, length: int, timer: Callback) -> None:
        super().__init__(config, callbacks=[timer])
        self.model_name, self.length = model, length

    def build_model(self) -> keras.Model:
        return build_model(self.model_name)

    def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer:
        return sgd(lr)

    def train_dataset(self) -> CycledArrays:
        return CycledArrays(synthetic_arrays(self.model_name), self.length)

    def training_step(self, net: keras.Model, batch: Any) -> tf.Tensor:
        x, y = batch
        return keras.losses.sparse_categorical_crossentropy(y, net(x, training=True), from_logits=True)


def rates_per_rank(model: str, batch_size: int, schedule: BatchSchedule,
                   ) -> tuple[list[list[float]] | None, int]:
    """Train on synthetic data through TensorFlowTrainer; every rank's samples/s per timed batch (on rank 0,
    None elsewhere) and the world size."""
    on_gpu = init_horovod()  # the trainer's thread and device settings; it calls this again in fit()
    timer = BatchTimer(schedule.warmup, schedule.steps_per_batch, batch_size,
                       synchronize=tf.test.experimental.sync_devices if on_gpu else None)
    trainer = SyntheticTrainer(train_config(batch_size, schedule), model,
                               schedule.steps * batch_size * hvd.size(), timer)
    trainer.fit()
    rates = hvd.allgather_object(timer.rates, name="bench.rates")
    return (rates if hvd.rank() == 0 else None), hvd.size()
