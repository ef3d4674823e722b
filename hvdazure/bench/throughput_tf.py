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

from hvdazure import TrainConfig
from hvdazure.bench.throughput_workload import (
    CNN_WIDTH,
    DISTINCT_SAMPLES,
    MODELS,
    MOMENTUM,
    BatchSchedule,
    BatchTimer,
    train_config,
)
from hvdazure.tensorflow import TensorFlowTrainer
from hvdazure.tensorflow.collectives import init_horovod
from hvdazure.tensorflow.data import ArrayData


def synthetic_arrays(shape: tuple[int, ...], classes: int, distinct: int = DISTINCT_SAMPLES,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """A few fixed random samples (as Horovod's synthetic benchmark, which trains on one random batch)."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((distinct, *shape), dtype=np.float32),
            rng.integers(0, classes, distinct).astype(np.int64))


class CycledArrays(ArrayData):
    """`length` samples cycling through the few of `data`: the trainer's exact data plan over a dataset of
    any length, with no memory for it (a 224x224 dataset of every step's samples would take gigabytes)."""

    def __init__(self, data: Any, length: int) -> None:
        super().__init__(data, "synthetic data")
        self.distinct, self.num_samples = self.num_samples, length

    def take(self, indices: Sequence[int]) -> Any:
        return super().take(cast(Sequence[int], np.asarray(indices, dtype=np.int64) % self.distinct))


def build_model(name: str) -> keras.Model:
    side, classes, _ = MODELS[name]
    if name == "resnet50":
        resnet = getattr(getattr(keras, "applications", None), "ResNet50", None)
        if resnet is None:
            raise RuntimeError("--model resnet50 needs keras.applications.ResNet50, which this Keras lacks")
        return resnet(weights=None, input_shape=(side, side, 3), classes=classes)
    layers, w = keras.layers, CNN_WIDTH
    return keras.Sequential([keras.Input((side, side, 3)),
                             layers.Conv2D(w, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
                             layers.Conv2D(2 * w, 3, padding="same", activation="relu"),
                             layers.MaxPooling2D(2),
                             layers.Conv2D(4 * w, 3, padding="same", activation="relu"),
                             layers.GlobalAveragePooling2D(), layers.Dense(classes)])


class SyntheticTrainer(TensorFlowTrainer):
    def __init__(self, config: TrainConfig, model: str, length: int, timer: BatchTimer) -> None:
        super().__init__(config, callbacks=[timer])
        self.model_name, self.length = model, length

    def build_model(self) -> keras.Model:
        return build_model(self.model_name)

    def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(learning_rate=lr, momentum=MOMENTUM)

    def train_dataset(self) -> tuple[np.ndarray, np.ndarray]:
        side, classes, _ = MODELS[self.model_name]
        return synthetic_arrays((side, side, 3), classes)

    def _load_datasets(self) -> int:
        self._train_data = CycledArrays(self.train_dataset(), self.length)
        self._eval_data = None
        return len(self._train_data)

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
