"""Keras 3 `model.fit` on several ranks: what horovod.tensorflow.keras did before Keras 3 broke it (Horovod
issue #4290), on horovod.tensorflow's collectives and hvdazure's core (sample plan, LR schedule,
checkpoint manager)::

    import hvdazure.tensorflow.keras as hk
    hk.init()                                            # first: Horovod, this rank's GPU or CPU threads
    train = hk.shard_for_fit((x, y), config.batch_size, seed=config.seed)
    model.compile(optimizer, loss, metrics, jit_compile=False)
    hk.data_parallel(model)                              # gradients averaged over ranks every step
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=config.epochs, shuffle=False,
              validation_data=hk.shard_for_evaluate((x_eval, y_eval), config.batch_size),
              callbacks=[hk.BroadcastInitialState(), hk.MetricAverage(),
                         hk.LearningRateSchedule(config, train.steps_per_epoch), hk.Checkpoint("ckpt")])
    predictions = hk.predict(model, x_new, config.batch_size)  # every sample once, in order, on every rank
"""

from hvdazure.tensorflow.keras.callbacks import (
    BroadcastInitialState,
    Checkpoint,
    LearningRateSchedule,
    MetricAverage,
    sum_metric_states,
)
from hvdazure.tensorflow.keras.datasets import FitData, shard_for_evaluate, shard_for_fit
from hvdazure.tensorflow.keras.prediction import predict
from hvdazure.tensorflow.keras.training import data_parallel, init
from hvdazure.tensorflow.sync_batchnorm import SyncBatchNormalization

__all__ = ["BroadcastInitialState", "Checkpoint", "FitData", "LearningRateSchedule", "MetricAverage",
           "SyncBatchNormalization", "data_parallel", "init", "predict", "shard_for_evaluate",
           "shard_for_fit", "sum_metric_states"]
