"""A small, exactly reproducible job on a ShardedDataset: linear regression in float64 on the tar shards of
tests/distributed/sharded_data.py, with TorchTrainer or TensorFlowTrainer (`--set extra.framework=...`).

Configured through TrainConfig's CLI. extra: framework (torch | tensorflow), data (the shards' source),
lanes (the order's, default 4), cache_dir (a ShardCache there: cache=True), batch_decode (tensorflow:
stack the samples in one batch_decode call), keras (tensorflow: after the trainer, the same data through
`model.fit` with shard_for_fit / shard_for_evaluate, 2 epochs at batch_size per rank), kill_rank +
kill_step (at the end of that optimizer step every rank reports what it has so far, then that rank kills
itself with SIGKILL as workers/misbehave.py does: lost outright, mid-epoch, its peers and DataLoader workers
running). Evaluation runs on the same shards. Each rank reports its final parameters and their sha256, the
history, the sample indices it trained on per epoch (in order), the parameters after every optimizer step,
its shard caches' stats (downloads, hits) when it has them, the pids of its child processes (DataLoader
workers) when it reports, and what Keras fit ended with.
"""

import hashlib
import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
from _report import report_rank

from hvdazure import Callback, TrainConfig
from hvdazure.data import ShardedDataset
from hvdazure.data.formats import default_decode


def as_tuple(raw: dict) -> tuple:
    """A raw tar sample -> (index, x, y), through the tar format's default decode; module-level, so that
    DataLoader workers can pickle it."""
    sample = default_decode("tar")(raw)
    return np.int64(sample["index"]), sample["x"], sample["y"]


def stacked(raws: list) -> tuple:
    """A batch_decode: the micro-batch's raw tar samples, decoded and stacked in one call."""
    samples = [as_tuple(raw) for raw in raws]
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


class Trajectory(Callback):
    """The parameters after every optimizer step, flattened."""

    def __init__(self) -> None:
        self.steps: list[list[float]] = []

    def on_step_end(self, trainer) -> None:
        self.steps.append([v for p in trainer.params() for v in p.flatten().tolist()])


class KillAtStep(Callback):
    """extra.kill_rank + extra.kill_step: at the end of that step every rank reports, then that rank waits
    for its peers' reports (so that the launcher's teardown cannot cut one short) and SIGKILLs itself."""

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory

    def on_step_end(self, trainer) -> None:
        extra = trainer.config.extra
        if trainer.state.step != extra.get("kill_step"):
            return
        report(trainer, self.trajectory, trainer.state.history)
        if trainer.rank == extra["kill_rank"]:
            out, deadline = Path(os.environ["HVDAZURE_TEST_OUT"]), time.monotonic() + 30
            while len(list(out.glob("rank-*.json"))) < trainer.world_size and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)


def torch_trainer(config: TrainConfig, trajectory: Trajectory):
    import torch

    from hvdazure.torch import TorchTrainer

    class Trainer(TorchTrainer):
        def __init__(self, config: TrainConfig, callbacks) -> None:
            super().__init__(config, callbacks)
            self.seen: dict[int, list[int]] = {}

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

        def predict_step(self, model, batch):
            index, x, _ = batch
            return {"index": index, "y": model(x)}

        def params(self) -> list[np.ndarray]:
            return [p.detach().numpy() for p in self.model.parameters()]

    return Trainer(config, callbacks=[trajectory, KillAtStep(trajectory)])


def tensorflow_trainer(config: TrainConfig, trajectory: Trajectory):
    import keras
    import tensorflow as tf

    from hvdazure.tensorflow import TensorFlowTrainer

    keras.config.set_floatx("float64")

    class Trainer(TensorFlowTrainer):
        def __init__(self, config: TrainConfig, callbacks) -> None:
            super().__init__(config, callbacks)
            self.seen: dict[int, list[int]] = {}

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

    return Trainer(config, callbacks=[trajectory, KillAtStep(trajectory)])


def xy(raw: dict) -> tuple:
    """A raw tar sample -> (x, y), Keras's form."""
    sample = default_decode("tar")(raw)
    return sample["x"], sample["y"]


def keras_fit(config: TrainConfig) -> dict:
    """Two epochs of model.fit on the shards (constant LR): the final weights and fit's history."""
    import keras

    import hvdazure.tensorflow.keras as hk

    hk.init()
    data = ShardedDataset(config.extra["data"], xy, lanes=config.extra.get("lanes", 4))
    train = hk.shard_for_fit(data, config.batch_size, seed=config.seed)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse", jit_compile=False)
    hk.data_parallel(model)
    history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=2, shuffle=False,
                        verbose=0, validation_data=hk.shard_for_evaluate(data, config.batch_size),
                        callbacks=[hk.BroadcastInitialState(), hk.MetricAverage()])
    return {"weights": [v for w in model.get_weights() for v in w.flatten().tolist()],
            "history": history.history, "steps_per_epoch": train.steps_per_epoch}


def report(trainer, trajectory: Trajectory, history: list[dict], keras: dict | None = None) -> None:
    """This rank's report (see the module docstring)."""
    params = trainer.params()
    report_rank(trainer.rank, {
        "params": [p.flatten().tolist() for p in params],
        "params_sha256": hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest(),
        "history": history,
        "seen": {str(k): v for k, v in trainer.seen.items()},
        "steps_per_epoch": trainer.steps_per_epoch,
        "trajectory": trajectory.steps,
        "cache": cache_stats(trainer.data),
        "eval_cache": cache_stats(trainer.eval_data),
        "children": [child.pid for child in psutil.Process().children(recursive=True)],
        "keras": keras,
    })


def predict_and_report(trainer, config: TrainConfig) -> None:
    """extra.predict_to: predict the shards into that URL (a ShardedDataset), after fit() or, with
    extra.predict_from (a checkpoint), without training; report the in-memory predictions too."""
    extra = config.extra
    checkpoint = extra.get("predict_from")
    written = trainer.predict(dataset(config), checkpoint=checkpoint, output=extra["predict_to"])
    in_memory = trainer.predict(dataset(config))
    report_rank(trainer.rank, {"written_samples": len(written),
                               "in_memory": {k: v.tolist() for k, v in in_memory.items()}})


if __name__ == "__main__":
    config = TrainConfig.from_cli(log_every=1, progress_bar=False)
    make = {"torch": torch_trainer, "tensorflow": tensorflow_trainer}[config.extra["framework"]]
    trajectory = Trajectory()
    trainer = make(config, trajectory)
    if config.extra.get("predict_from"):
        predict_and_report(trainer, config)
        raise SystemExit(0)
    history = trainer.fit()
    if config.extra.get("predict_to"):
        predict_and_report(trainer, config)
        raise SystemExit(0)
    report(trainer, trajectory, history, keras_fit(config) if config.extra.get("keras") else None)
