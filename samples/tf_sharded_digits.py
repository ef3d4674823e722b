"""Train the digits MLP of samples/tf_digits.py (Keras 3) on shards (hvdazure.data.ShardedDataset), here
TFRecord shards decoded a batch at a time by tf.io.parse_example. Write the shards first:

    python samples/pack_digits.py data/digits-tfr --format tfrecord
    hvdazure run -np 2 samples/tf_sharded_digits.py --set extra.data=data/digits-tfr
    hvdazure run -np 2 samples/tf_sharded_digits.py --set extra.data=abfs://CONTAINER/digits-tfr

Batches come through a prefetching tf.data pipeline along each rank's plan; the dataset is never in
memory as a whole. Tar or Parquet shards work the same way with a per-sample `decode` instead.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from hvdazure import TrainConfig
from hvdazure.data import ShardedDataset
from hvdazure.tensorflow import TensorFlowTrainer

# write_shards stores a NumPy array raw: its bytes, plus "image.dtype" and "image.shape" features
# (hvdazure/data/formats/tfrecord.py); an int label is an int64 feature
FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse_batch(records: list[bytes]) -> tuple[tf.Tensor, tf.Tensor]:
    """A micro-batch of serialized tf.train.Example records -> (images, labels), in one call."""
    parsed = tf.io.parse_example(tf.constant(records), FEATURES)
    images = tf.reshape(tf.io.decode_raw(parsed["image"], tf.float32), (-1, 64))
    return images, parsed["label"]


def digits(split: str, data: str) -> ShardedDataset:
    return ShardedDataset(f"{data.rstrip('/')}/{split}", batch_decode=parse_batch)


class ShardedDigitsTrainer(TensorFlowTrainer):
    def build_model(self) -> keras.Model:
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                                 keras.layers.Dense(10)])

    def build_optimizer(self, lr):
        return keras.optimizers.SGD(learning_rate=lr, momentum=0.9)

    def train_dataset(self):
        return digits("train", self.config.extra["data"])

    def eval_dataset(self):
        return digits("eval", self.config.extra["data"])

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
                                  log_every=10, extra={"data": "data/digits-tfr"})
    trainer = ShardedDigitsTrainer(config)
    final = trainer.fit()[-1]
    if trainer.is_main:
        print(f"final: eval accuracy {final['eval_accuracy']:.4f}, eval loss {final['eval_loss']:.4f}, "
              f"train loss {final['train_loss']:.4f}", flush=True)
