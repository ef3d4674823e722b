"""The TensorFlow side of the overhead benchmark (an OverheadSide): the same MLP and data as
overhead_torch.py (overhead_workload.py), Horovod's TF2 example loop on Keras 3 and the same training
through TensorFlowTrainer, each timed over one block of steps (setup excluded). Imported in ranks only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdazure import TrainConfig
from hvdazure.bench.overhead_workload import (
    CLASSES,
    FEATURES,
    HAND,
    HIDDEN,
    LOG_EVERY,
    LR,
    TRAINER,
    UNTIMED,
    BlockTime,
    InStepTimer,
    StepClock,
    time_after_first_step,
)
from hvdazure.tensorflow import TensorFlowTrainer
from hvdazure.tensorflow.collectives import init_horovod


def arrays(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((samples, FEATURES), dtype=np.float32),
            rng.integers(0, CLASSES, samples).astype(np.int64))


def model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(CLASSES)])


def loss_of(net: keras.Model, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return keras.losses.sparse_categorical_crossentropy(y, net(x, training=True), from_logits=True)


def hand_written(data: tuple[np.ndarray, np.ndarray], batch_size: int) -> list[float]:
    """Horovod's TensorFlow 2 example loop on Keras 3, one epoch: a tf.function step with
    hvd.DistributedGradientTape (one grouped allreduce; Keras 3 variables have no .ref(), so the tape
    differentiates with respect to their backing tf.Variables), variables broadcast from rank 0, a sharded,
    shuffled, prefetched tf.data pipeline, the loss averaged every LOG_EVERY steps. Every step's wall time."""
    x, y = data
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
               .shuffle(len(x) // hvd.size(), seed=0, reshuffle_each_iteration=True)
               .batch(batch_size).prefetch(tf.data.AUTOTUNE))
    net = model()
    optimizer = keras.optimizers.SGD(learning_rate=LR * hvd.size())
    optimizer.build(net.trainable_variables)
    hvd.broadcast_variables([v.value for v in [*net.variables, *optimizer.variables]], root_rank=0)
    backing = [v.value for v in net.trainable_variables]

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_of(net, xb, yb))
        gradients = hvd.DistributedGradientTape(tape, groups=1).gradient(loss, backing)
        optimizer.apply_gradients(zip(gradients, net.trainable_variables, strict=True))
        return loss

    durations = []
    mark = time.perf_counter()
    for steps, (xb, yb) in enumerate(dataset, 1):
        loss = step(xb, yb)
        if steps % LOG_EVERY == 0:
            hvd.allreduce(loss, name="loss").numpy()
        now = time.perf_counter()
        durations.append(now - mark)
        mark = now
    return durations


class BenchTrainer(TensorFlowTrainer, InStepTimer):
    """The same model, data and optimizer; times its run_step (the rest of a step is its bookkeeping)."""

    def __init__(self, config: TrainConfig, data: tuple[np.ndarray, np.ndarray], clock: StepClock) -> None:
        super().__init__(config, callbacks=[clock])
        self.data = data

    def build_model(self) -> keras.Model:
        return model()

    def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(learning_rate=lr)

    def train_dataset(self) -> tuple[np.ndarray, np.ndarray]:
        return self.data

    def training_step(self, net: keras.Model, batch: Any) -> tf.Tensor:
        x, y = batch
        return loss_of(net, x, y)


def block_runners(steps: int, batch_size: int) -> dict[str, Callable[[], BlockTime]]:
    """A block of `steps` steps of each variant (one epoch of the data): its time after the first step (which
    traces the tf.function), and the trainer's outside its step."""
    init_horovod()  # the trainer's thread and device settings, for both variants
    data = arrays(steps * batch_size * hvd.size())

    def trainer(step_times: bool) -> BlockTime:
        clock = StepClock()
        bench = BenchTrainer(TrainConfig(epochs=1, batch_size=batch_size, lr=LR, log_every=LOG_EVERY,
                                         progress_bar=False, step_times=step_times), data, clock)
        bench.fit()
        return time_after_first_step(clock.durations, bench.in_step_s)

    return {HAND: lambda: time_after_first_step(hand_written(data, batch_size)),
            TRAINER: lambda: trainer(True), UNTIMED: lambda: trainer(False)}


def slowest_rank(seconds: float) -> float:
    """The slowest rank's time for a block."""
    return float(hvd.allreduce(tf.constant(seconds, tf.float64), op=hvd.Max, name="bench.block").numpy())


def rank() -> int:
    return hvd.rank()


def world_size() -> int:
    return hvd.size()
