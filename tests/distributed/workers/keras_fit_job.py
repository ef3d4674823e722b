"""A small, exactly reproducible Keras `model.fit` job on hvdazure.tensorflow.keras: linear regression in
float64, plain SGD, 33 training samples in batches of 4 per rank (on 2 ranks the last step of each epoch
holds 1 sample, so one rank has none), 5 evaluation samples (split 3 + 2).

Configured through TrainConfig's CLI (epochs, batch_size, lr, warmup_steps, schedule, seed). Each rank
starts from its own random weights (BroadcastInitialState must replace them) and reports: the data, its
weights after the broadcast and after fit, its metrics' local state variables before MetricAverage sums
them (train and validation, per epoch), fit's history, the LR of every step, and its checkpoint directory
(ckpt-rank<r>: only rank 0's may exist). Then one more epoch with a Checkpoint that rank 0 cannot write:
each rank reports the exception it got (type and message); and the one a LearningRateSchedule for
zero_stage 1 raises.
"""

import dataclasses
import os

import horovod.tensorflow as hvd
import keras
import numpy as np
from _report import report_rank

import hvdazure.tensorflow.keras as hk
from hvdazure import TrainConfig


def metric_states(model: keras.Model) -> dict[str, float]:
    return {v.path: float(v.numpy()) for m in model.metrics for v in m.variables}


class LocalMetricStates(keras.callbacks.Callback):
    """Placed before MetricAverage: what this rank counted itself, before the sums over ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.train: list[dict[str, float]] = []
        self.val: list[dict[str, float]] = []

    def on_test_begin(self, logs=None) -> None:
        self.train.append(metric_states(self.model))

    def on_test_end(self, logs=None) -> None:
        self.val.append(metric_states(self.model))


class Recorder(keras.callbacks.Callback):
    """Placed after the hvdazure callbacks: weights after the broadcast, and the LR each step used."""

    def __init__(self) -> None:
        super().__init__()
        self.initial: list[list] = []
        self.lrs: list[float] = []

    def on_train_begin(self, logs=None) -> None:
        self.initial = [w.tolist() for w in self.model.get_weights()]

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))


def main() -> None:
    config = TrainConfig.from_cli(epochs=3, batch_size=4, lr=0.05, warmup_steps=3, schedule="cosine", seed=3)
    hk.init()
    keras.config.set_floatx("float64")
    rng = np.random.default_rng(7)
    x = rng.normal(size=(38, 3))
    y = x @ np.array([[1.5], [-2.0], [0.5]]) + 0.3 + 0.1 * rng.normal(size=(38, 1))
    train_data, eval_data = (x[:33], y[:33]), (x[33:], y[33:])

    keras.utils.set_random_seed(100 + hvd.rank())  # different initial weights on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=config.lr), loss="mse", metrics=["mae"],
                  jit_compile=False)
    hk.data_parallel(model)
    train = hk.shard_for_fit(train_data, config.batch_size, seed=config.seed)

    local, recorder = LocalMetricStates(), Recorder()
    checkpoints = os.path.join(os.environ["HVDAZURE_TEST_OUT"], f"ckpt-rank{hvd.rank()}")
    callbacks = [local, hk.BroadcastInitialState(), hk.MetricAverage(),
                 hk.LearningRateSchedule(config, train.steps_per_epoch),
                 hk.Checkpoint(checkpoints, keep_last=2), recorder]
    history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=config.epochs,
                        validation_data=hk.shard_for_evaluate(eval_data, config.batch_size),
                        callbacks=callbacks, shuffle=False, verbose=0)

    # hk.predict over 101 samples in batches of 8 (2 ranks: 7 and 6 batches), against the same batches
    # predicted here alone: the same bytes, in the same order
    unseen = np.random.default_rng(8).normal(size=(101, 3))
    predictions = hk.predict(model, unseen, 8)
    alone = np.concatenate([model.predict_on_batch(unseen[i : i + 8]) for i in range(0, 101, 8)])
    final_weights = [w.tolist() for w in model.get_weights()]

    # a save that fails on rank 0 (a directory not even root can create) is an error on every rank
    failed_save = None
    try:
        model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hk.Checkpoint("/proc/hvdazure-cannot-write-here")])
    except Exception as exc:
        failed_save = [type(exc).__name__, str(exc)]

    # sharded optimizer state is PyTorch-only: LearningRateSchedule (where model.fit meets the config)
    # refuses zero_stage 1 on every rank before fit starts
    try:
        hk.LearningRateSchedule(dataclasses.replace(config, zero_stage=1), train.steps_per_epoch)
        sharding_refused = None
    except Exception as exc:
        sharding_refused = [type(exc).__name__, str(exc)]

    report_rank(hvd.rank(), {
        "predictions_shape": list(predictions.shape),
        "predictions_as_alone": predictions.tobytes() == alone.tobytes(),
        "x": x.tolist(), "y": y.tolist(), "steps_per_epoch": train.steps_per_epoch,
        "initial_weights": recorder.initial, "final_weights": final_weights, "failed_save": failed_save,
        "sharding_refused": sharding_refused,
        "local_train_states": local.train, "local_val_states": local.val, "history": history.history,
        "lrs": recorder.lrs, "checkpoint_dir": checkpoints,
    })


if __name__ == "__main__":
    main()
