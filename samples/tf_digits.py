"""Train an MLP on scikit-learn's bundled digits (8x8 images, 10 classes; no download) with Keras 3.

    hvdazure run -np 2 samples/tf_digits.py                    # 2 local ranks (Gloo)
    hvdazure run -np 2 --mpi samples/tf_digits.py --set epochs=20
    python samples/tf_digits.py                                # 1 process
"""

from __future__ import annotations

import keras
import numpy as np
from sklearn.datasets import load_digits

from hvdazure import TrainConfig
from hvdazure.tensorflow import TensorFlowTrainer


def digits_split(seed: int = 0, eval_fraction: float = 0.2) -> tuple[tuple, tuple]:
    """The same train/eval split on every rank: a fixed permutation of the 1797 images."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_eval = int(len(x) * eval_fraction)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    return (x[train_idx], y[train_idx]), (x[eval_idx], y[eval_idx])


class DigitsTrainer(TensorFlowTrainer):
    def build_model(self) -> keras.Model:
        hidden = self.config.extra.get("hidden", 128)
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                                 keras.layers.Dense(10)])

    def build_optimizer(self, lr):
        return keras.optimizers.SGD(learning_rate=lr, momentum=0.9)

    def train_dataset(self):
        return digits_split()[0]

    def eval_dataset(self):
        return digits_split()[1]

    def training_step(self, model, batch):
        x, y = batch
        logits = model(x, training=True)
        return {"loss": keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True),
                "accuracy": keras.metrics.sparse_categorical_accuracy(y, logits)}

    def validation_step(self, model, batch):
        x, y = batch
        logits = model(x, training=False)
        return {"loss": keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True),
                "accuracy": keras.metrics.sparse_categorical_accuracy(y, logits)}


if __name__ == "__main__":
    config = TrainConfig.from_cli(epochs=15, batch_size=32, lr=0.05, warmup_epochs=1, schedule="cosine",
                                  log_every=10)
    trainer = DigitsTrainer(config)
    final = trainer.fit()[-1]  # the history is identical on every rank; rank 0 reports it
    if trainer.is_main:
        print(f"final: eval accuracy {final['eval_accuracy']:.4f}, eval loss {final['eval_loss']:.4f}, "
              f"train loss {final['train_loss']:.4f}", flush=True)
