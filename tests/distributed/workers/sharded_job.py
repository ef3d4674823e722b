"""A small, exactly reproducible job on a ShardedDataset: linear regression in float64 on the tar shards of
tests/distributed/sharded_data.py, with TorchTrainer or TensorFlowTrainer (`--set extra.framework=...`).

Configured through TrainConfig's CLI. extra: framework (torch | tensorflow), data (the shards' source),
lanes (the order's, default 4), cache_dir (a ShardCache there: cache=True), batch_decode (tensorflow:
stack the samples in one batch_decode call). Evaluation runs on the same shards. Each rank reports its
final parameters and their sha256, the history, the sample indices it trained on per epoch (in order),
and its shard cache's stats (downloads, hits) when it has one.
"""

import hashlib

import numpy as np
from _report import report_rank

from hvdazure import TrainConfig
from hvdazure.data import ShardedDataset


def as_tuple(sample: dict) -> tuple:
    """A decoded tar sample -> (index, x, y); module-level, so that DataLoader workers can pickle it."""
    return np.int64(sample["index"]), sample["x"], sample["y"]


def stacked(raws: list) -> tuple:
    """A batch_decode: the micro-batch's raw tar samples, decoded and stacked in one call."""
    from hvdazure.data.formats import default_decode

    decode = default_decode("tar")
    samples = [as_tuple(decode(raw)) for raw in raws]
    return tuple(np.stack(column) for column in zip(*samples, strict=True))


def dataset(config: TrainConfig) -> ShardedDataset:
    extra = config.extra
    cache = {"cache": True, "cache_dir": extra["cache_dir"]} if extra.get("cache_dir") else {}
    if extra.get("batch_decode"):
        return ShardedDataset(extra["data"], batch_decode=stacked, lanes=extra.get("lanes", 4), **cache)
    return ShardedDataset(extra["data"], as_tuple, lanes=extra.get("lanes", 4), **cache)


def cache_stats(data: ShardedDataset) -> dict | None:
    stats = getattr(data._shards, "stats", None)
    return None if stats is None else {"downloads": stats.downloads, "hits": stats.hits}


def torch_trainer(config: TrainConfig):
    import torch

    from hvdazure.torch import TorchTrainer

    class Trainer(TorchTrainer):
        seen: dict[int, list[int]] = {}

        def build_model(self):
            return torch.nn.Linear(3, 1, dtype=torch.float64)

        def build_optimizer(self, params, lr):
            return torch.optim.SGD(params, lr=lr)

        def train_dataset(self):
            self.data = dataset(self.config)
            return self.data

        def eval_dataset(self):
            self.eval_data = dataset(self.config)
            return self.eval_data

        def training_step(self, model, batch):
            index, x, y = batch
            self.seen.setdefault(self.state.epoch, []).extend(index.tolist())
            return torch.nn.functional.mse_loss(model(x), y)

        def validation_step(self, model, batch):
            index, x, y = batch
            return {"mse": torch.nn.functional.mse_loss(model(x), y), "index": index.double().mean()}

        def params(self) -> list[np.ndarray]:
            return [p.detach().numpy() for p in self.model.parameters()]

    return Trainer(config)


def tensorflow_trainer(config: TrainConfig):
    import keras
    import tensorflow as tf

    from hvdazure.tensorflow import TensorFlowTrainer

    keras.config.set_floatx("float64")

    class Trainer(TensorFlowTrainer):
        seen: dict[int, list[int]] = {}

        def build_model(self):
            return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

        def build_optimizer(self, lr):
            return keras.optimizers.SGD(learning_rate=lr)

        def train_dataset(self):
            self.data = dataset(self.config)
            return self.data

        def eval_dataset(self):
            self.eval_data = dataset(self.config)
            return self.eval_data

        def _record(self, index) -> None:
            self.seen.setdefault(self.state.epoch, []).extend(index.numpy().tolist())

        def training_step(self, model, batch):
            index, x, y = batch
            tf.py_function(self._record, [index], [])
            return tf.reduce_mean(tf.square(model(x) - y))

        def validation_step(self, model, batch):
            index, x, y = batch
            return {"mse": tf.reduce_mean(tf.square(model(x) - y)), "index": tf.cast(index, tf.float64)}

        def params(self) -> list[np.ndarray]:
            return [np.asarray(w) for w in self.model.get_weights()]

    return Trainer(config)


if __name__ == "__main__":
    config = TrainConfig.from_cli(log_every=1, progress_bar=False)
    make = {"torch": torch_trainer, "tensorflow": tensorflow_trainer}[config.extra["framework"]]
    trainer = make(config)
    history = trainer.fit()
    params = trainer.params()
    report_rank(trainer.rank, {
        "params": [p.flatten().tolist() for p in params],
        "params_sha256": hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest(),
        "history": history,
        "seen": {str(k): v for k, v in trainer.seen.items()},
        "steps_per_epoch": trainer.steps_per_epoch,
        "cache": cache_stats(trainer.data),
        "eval_cache": cache_stats(trainer.eval_data),
    })
