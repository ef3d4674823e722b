"""Keras 3 `model.fit` on several ranks: an MLP on scikit-learn's bundled digits (8x8 images, no download).

    hvdazure run -np 2 samples/keras_fit_digits.py                  # 2 local ranks (Gloo)
    hvdazure run -np 2 samples/keras_fit_digits.py --set epochs=20 --set checkpoint_dir=ckpt
    python samples/keras_fit_digits.py                              # 1 process

The same split and settings as samples/tf_digits.py (the TensorFlowTrainer), with model.fit instead.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import keras
from tf_digits import digits_split  # the same split as the TensorFlowTrainer sample, beside this file

import hvdazure.tensorflow.keras as hk
from hvdazure import TrainConfig


def main() -> None:
    config = TrainConfig.from_cli(epochs=15, batch_size=32, lr=0.05, warmup_epochs=1, schedule="cosine")
    hk.init()
    keras.utils.set_random_seed(config.seed)
    train_data, eval_data = digits_split()
    train = hk.shard_for_fit(train_data, config.batch_size, seed=config.seed)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(config.extra.get("hidden", 128),
                                                                     activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=config.lr, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    hk.data_parallel(model, reduce_op=config.reduce_op, compression=config.compression)

    callbacks = [hk.BroadcastInitialState(), hk.MetricAverage(),
                 hk.LearningRateSchedule(config, train.steps_per_epoch)]
    if config.checkpoint_dir:
        callbacks.append(hk.Checkpoint(config.checkpoint_dir, keep_last=config.keep_last))
    history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=config.epochs,
                        validation_data=hk.shard_for_evaluate(eval_data, config.batch_size),
                        callbacks=callbacks, shuffle=False, verbose=2 if hvd.rank() == 0 else 0)

    final = {name: values[-1] for name, values in history.history.items()}  # identical on every rank
    if hvd.rank() == 0:
        print(f"final: eval accuracy {final['val_accuracy']:.4f}, eval loss {final['val_loss']:.4f}, "
              f"train loss {final['loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()
