"""One process on the real binding (1 rank, no launcher): trainers whose hooks make a common mistake, and the
sanity check's promise that it changes nothing. Run by test_hook_mistakes.py as `python hook_mistakes_job.py
torch|tensorflow`; prints one JSON object, case name -> what happened.

Each case trains a small classifier (8 features, 2 classes) with Dropout and BatchNorm for an epoch or two;
`mistake` picks what training_step / validation_step get wrong. A case reports the error it ended with (its
type, one-line message, notes and the names of the traceback's frames) and how often training_step ran
(PyTorch: per step; TensorFlow: per trace), or else the trained weights, history and trace counts.
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
import typing
from typing import Any

import numpy as np

from hvdazure import TrainConfig


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def run(trainer_class: type, **fields: Any) -> dict[str, Any]:
    extra = fields.pop("extra", {})
    config = TrainConfig(**{"epochs": 1, "batch_size": 8, "lr": 0.1, "progress_bar": False, "log_every": 1000,
                            "extra": {"n_train": 64, "n_eval": 20, **extra}, **fields})
    trainer = trainer_class(config)
    try:
        history = trainer.fit()
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "notes": getattr(exc, "__notes__", []),
                "frames": [frame.name for frame in traceback.extract_tb(exc.__traceback__)],
                "training_steps": trainer.training_steps}
    return {"history": history, "weights": trainer.weights_sha256(), "traces": trainer.traces}


def torch_cases() -> dict[str, Any]:
    import torch
    from torch.utils.data import TensorDataset

    from hvdazure.torch import TorchTrainer

    def dataset(n: int, seed: int) -> TensorDataset:
        x, y = data(n, seed)
        return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

    class Classifier(TorchTrainer):
        training_steps = 0
        traces: typing.ClassVar[dict[str, int]] = {}  # nothing is traced

        def build_model(self) -> torch.nn.Module:
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
            if self.config.extra.get("frozen_batchnorm"):
                model[1].eval()  # the user's choice: its statistics stay as they are in training too
            return model

        def build_optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
            return torch.optim.SGD(params, lr=lr, momentum=0.9)

        def train_dataset(self) -> TensorDataset:
            return dataset(self.config.extra["n_train"], 0)

        def eval_dataset(self) -> TensorDataset:
            return dataset(self.config.extra["n_eval"], 1)

        def training_step(self, model: torch.nn.Module, batch: Any) -> Any:
            self.training_steps += 1
            x, y = batch
            logits = model(x)
            mistake = self.config.extra.get("mistake")
            if mistake == "per_sample_loss":
                return torch.nn.functional.cross_entropy(logits, y, reduction="none")
            if mistake == "no_return":
                return None
            loss = torch.nn.functional.cross_entropy(logits, y)
            if mistake == "metric_per_sample":
                return {"loss": loss, "correct": (logits.argmax(1) == y).float()}
            return loss

        def validation_step(self, model: torch.nn.Module, batch: Any) -> Any:
            x, y = batch
            logits = model(x)
            mistake = self.config.extra.get("mistake")
            if mistake == "probabilities":
                return {"loss": torch.nn.functional.cross_entropy(logits, y), "probs": logits.softmax(1)}
            if mistake == "broken_validation":
                return {"accuracy": batch["label"]}
            return {"loss": torch.nn.functional.cross_entropy(logits, y),
                    "accuracy": (logits.argmax(1) == y).float().mean(),
                    "dropout_left_on": float(torch.rand(()))}  # draws from torch's RNG, as a dropout would

        def weights_sha256(self) -> str:
            state = self.model.state_dict()
            return hashlib.sha256(b"".join(t.numpy().tobytes() for t in state.values())).hexdigest()

    return common_cases(Classifier) | {
        "per_sample_loss": run(Classifier, extra={"mistake": "per_sample_loss"}),
        "frozen_batchnorm_checked": run(Classifier, epochs=2, extra={"frozen_batchnorm": True}),
        "frozen_batchnorm_unchecked": run(Classifier, epochs=2, sanity_check=False,
                                          extra={"frozen_batchnorm": True}),
    }


def tensorflow_cases() -> dict[str, Any]:
    import keras

    from hvdazure.tensorflow import TensorFlowTrainer

    class Classifier(TensorFlowTrainer):
        training_steps = 0

        def __init__(self, config: TrainConfig) -> None:
            super().__init__(config)
            self.traces = {"validation_step": 0}

        def build_model(self) -> keras.Model:
            return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                     keras.layers.BatchNormalization(), keras.layers.ReLU(),
                                     keras.layers.Dropout(0.3), keras.layers.Dense(2)])

        def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer:
            return keras.optimizers.SGD(learning_rate=lr, momentum=0.9)

        def train_dataset(self) -> Any:
            return data(self.config.extra["n_train"], 0)

        def eval_dataset(self) -> Any:
            return data(self.config.extra["n_eval"], 1)

        def training_step(self, model: keras.Model, batch: Any) -> Any:
            self.training_steps += 1  # per trace
            x, y = batch
            logits = model(x, training=True)
            loss = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)  # per sample
            mistake = self.config.extra.get("mistake")
            if mistake == "per_element_loss":
                return keras.ops.square(logits)
            if mistake == "no_return":
                return None
            if mistake == "metric_per_sample":  # per sample: averaged, as Keras's metrics are
                return {"loss": loss, "accuracy": keras.metrics.sparse_categorical_accuracy(y, logits)}
            if mistake == "metric_per_element":
                return {"loss": loss, "probs": keras.ops.softmax(logits)}
            if mistake == "py_function":  # runs in TensorFlow, not in XLA (compile: true)
                import tensorflow as tf

                tf.py_function(lambda: None, [], [])
            return loss

        def validation_step(self, model: keras.Model, batch: Any) -> Any:
            self.traces["validation_step"] += 1
            x, y = batch
            logits = model(x, training=False)
            loss = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            mistake = self.config.extra.get("mistake")
            if mistake == "probabilities":
                return {"loss": loss, "probs": keras.ops.softmax(logits)}
            if mistake == "broken_validation":
                return {"accuracy": batch["label"]}
            dropout = model.layers[3]  # drawn from its seed generator, one of this rank's RNG streams
            return {"loss": loss, "accuracy": keras.metrics.sparse_categorical_accuracy(y, logits),
                    "dropout_left_on": keras.ops.mean(dropout(keras.ops.arange(1.0, 65.0), training=True))}

        def weights_sha256(self) -> str:
            weights = self.model.get_weights()
            return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in weights)).hexdigest()

    return common_cases(Classifier) | {
        "per_element_loss": run(Classifier, extra={"mistake": "per_element_loss"}),
        "metric_per_element": run(Classifier, extra={"mistake": "metric_per_element"}),
        "not_compilable": run(Classifier, compile=True, extra={"mistake": "py_function"}),
    }


def common_cases(trainer_class: type) -> dict[str, Any]:
    return {
        "no_return": run(trainer_class, extra={"mistake": "no_return"}),
        "metric_per_sample": run(trainer_class, extra={"mistake": "metric_per_sample"}),
        "probabilities": run(trainer_class, extra={"mistake": "probabilities"}),
        "broken_validation": run(trainer_class, extra={"mistake": "broken_validation"}),
        "empty_eval_set": run(trainer_class, extra={"n_eval": 0}),
        # 3 evaluation samples, in batches of 8: the check's batch is the whole set
        "checked": run(trainer_class, epochs=2, extra={"n_eval": 3}),
        "unchecked": run(trainer_class, epochs=2, sanity_check=False, extra={"n_eval": 3}),
    }


if __name__ == "__main__":
    cases = torch_cases() if sys.argv[1] == "torch" else tensorflow_cases()
    print(json.dumps(cases, default=float))
