"""Trainings of a Linear-BatchNorm-Linear regression in float64 with `sync_batchnorm: true`, one after
another in one job, for the tests to compare N ranks x b with 1 process x N*b (the data of torch_job.py).

extra: framework ("torch"; or "tf": TensorFlowTrainer, then Keras `model.fit` through
       hvdazure.tensorflow.keras with hk.SyncBatchNormalization), trainings (a list of [n_train,
       global_batch, grad_accum_steps]: each training's per-rank batch_size is global_batch / world size;
       Keras fit, which has no accumulation, runs those with grad_accum_steps 1 only).
Each rank reports, per training, the final weights and the BatchNorm running statistics (in the weights
for Keras: moving mean and variance), and how many batches the BatchNorm layer counted (PyTorch).
"""

import sys
from pathlib import Path

from _report import report_rank

from hvdazure import TrainConfig, detect_cluster

sys.path.insert(0, str(Path(__file__).parent))


def torch_training(config: TrainConfig) -> dict:
    import torch
    from torch_job import Regression

    from hvdazure.torch import TorchTrainer

    class BatchNormRegression(TorchTrainer):
        def build_model(self):
            return torch.nn.Sequential(torch.nn.Linear(3, 4, dtype=torch.float64),
                                       torch.nn.BatchNorm1d(4, dtype=torch.float64),
                                       torch.nn.Linear(4, 1, dtype=torch.float64))

        def build_optimizer(self, params, lr):
            return torch.optim.SGD(params, lr=lr)

        def train_dataset(self):
            return Regression(self.config.extra["n_train"], 3, seed=1)

        def training_step(self, model, batch):
            _, x, y = batch
            return torch.nn.functional.mse_loss(model(x), y)

    trainer = BatchNormRegression(config)
    trainer.fit()
    state = trainer.model.state_dict()
    return {"rank": trainer.rank,
            "weights": [state[k].flatten().tolist() for k in sorted(state) if "num_batches" not in k],
            "batchnorm_batches": int(state["1.num_batches_tracked"])}


def tf_training(config: TrainConfig) -> dict:
    import keras
    from tf_job import regression  # sets floatx float64

    from hvdazure.tensorflow import TensorFlowTrainer

    class BatchNormRegression(TensorFlowTrainer):
        def build_model(self):
            return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                     keras.layers.BatchNormalization(), keras.layers.Dense(1)])

        def build_optimizer(self, lr):
            return keras.optimizers.SGD(learning_rate=lr)

        def train_dataset(self):
            return regression(self.config.extra["n_train"], 3, seed=1)

        def training_step(self, model, batch):
            _, x, y = batch
            return keras.ops.mean(keras.ops.square(model(x, training=True) - y))

    trainer = BatchNormRegression(config)
    trainer.fit()
    return {"rank": trainer.rank, "weights": [w.flatten().tolist() for w in trainer.model.get_weights()]}


def keras_fit_training(config: TrainConfig) -> dict:
    import horovod.tensorflow as hvd
    import keras
    from tf_job import regression

    import hvdazure.tensorflow.keras as hk

    hk.init()
    _, x, y = regression(config.extra["n_train"], 3, seed=1)
    keras.utils.set_random_seed(config.seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), hk.SyncBatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=config.lr), loss="mse", jit_compile=False)
    hk.data_parallel(model)
    train = hk.shard_for_fit((x, y), config.batch_size, seed=config.seed)
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=config.epochs, shuffle=False,
              callbacks=[hk.BroadcastInitialState()], verbose=0)
    return {"rank": hvd.rank(), "weights": [w.flatten().tolist() for w in model.get_weights()]}


def main() -> None:
    config = TrainConfig.from_cli(epochs=2, lr=0.1, lr_scaling="none", log_every=1, progress_bar=False,
                                  sync_batchnorm=True)
    world_size = detect_cluster().size
    kinds = {"torch": {"torch": torch_training},
             "tf": {"tf": tf_training, "keras_fit": keras_fit_training}}[config.extra["framework"]]
    if "torch" in kinds and world_size > 1:  # sharded (zero_stage 2, a bucket a tensor or two): the same
        kinds["torch_zero"] = lambda c: torch_training(c.replace(zero_stage=2, zero_bucket_mb=0.0001))
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for kind, run in kinds.items():
        for n_train, global_batch, accum in config.extra["trainings"]:
            if kind == "keras_fit" and accum != 1:
                continue
            extra = {**config.extra, "n_train": n_train}
            results[kind].append(run(config.replace(batch_size=global_batch // world_size,
                                                    grad_accum_steps=accum, extra=extra)))
    report_rank(detect_cluster().rank, {"world_size": world_size, **results})


if __name__ == "__main__":
    main()
