"""predict() and test() on real ranks: `predict_job.py torch|tensorflow train|load CHECKPOINT_DIR`.

The regression trainers of torch_job.py / tf_job.py (float64), with a predict_step: the torch one returns a
dict {"index", "y"}, the TensorFlow one one tensor [index, y] per sample, so the report shows which
samples were predicted, in which order. 101 samples to predict, batch_size 8: neither divides the other
or the world size.

train: fit one epoch with checkpoints in CHECKPOINT_DIR, then predict and test with the trained model; a
       second trainer predicts and tests from checkpoint="latest" without fit() (no training data read);
       a third, whose build_model loads the trained weights from a plain file (torch.save / Keras
       save_weights, written by rank 0 after fit) on rank 0 only, predicts and tests without a checkpoint
       (rank 0's model sent to every rank: "pretrained"); that file named as checkpoint= and a checkpoint
       of another model are refused (their one-line messages reported).
       The trained run logs a metric with trainer.log_metrics from a callback (reported: its epoch mean);
       TensorFlow: log_metrics inside the compiled training_step is refused (reported).
load:  only a trainer's predict/test from the checkpoint directory (given as a path), as a separate
       job at another world size would.
PyTorch trains with its optimizer sharded (zero_stage 2): its checkpoints' model.pt must still hold the whole
model, and every rank's weights be whole after fit(), for the predictions and exports to match.
Rank r writes its predictions to HVDAZURE_TEST_OUT/predictions-<r>-<name>.npz and reports the metrics.
Exports: train, rank 0: the trained model (trainer.export: model.onnx, model.keras); load: from the
checkpoint directory without a trainer (export: model.pt2, saved_model/).
"""

import importlib
import os
import sys
from pathlib import Path

import numpy as np
from _report import report_rank

from hvdazure import Callback, TrainConfig
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.core.config import ConfigError

FRAMEWORK, MODE, CHECKPOINTS = sys.argv[1], sys.argv[2], sys.argv[3]
job = importlib.import_module({"torch": "torch_job", "tensorflow": "tf_job"}[FRAMEWORK])
N_PREDICT = 101

class Counting(job.RegressionTrainer):
    """Counts the calls of train_dataset(): predict() and test() before any fit() must not read it."""

    train_dataset_calls = 0

    def train_dataset(self):
        self.train_dataset_calls += 1
        return super().train_dataset()


if FRAMEWORK == "torch":
    import torch

    class Predicting(Counting):
        def predict_step(self, model, batch):
            index, x, _ = batch
            return {"index": index, "y": model(x)}

        def predict_dataset(self):
            return job.Regression(N_PREDICT, 3, seed=3)

    class OtherModel(Predicting):
        def build_model(self):
            return torch.nn.Linear(5, 1, dtype=torch.float64)

    PRETRAINED = "pretrained.pt"

    def save_pretrained(model, path):
        torch.save(model.state_dict(), path)

    def load_pretrained(model, path):
        model.load_state_dict(torch.load(path, weights_only=True))
else:
    import keras

    class Predicting(Counting):
        def predict_step(self, model, batch):
            index, x, _ = batch
            index = keras.ops.cast(index[:, None], "float64")
            return keras.ops.concatenate([index, model(x, training=False)], axis=1)

        def predict_dataset(self):
            return job.regression(N_PREDICT, 3, seed=3)

    class OtherModel(Predicting):
        def build_model(self):
            return keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])

    PRETRAINED = "pretrained.weights.h5"

    def save_pretrained(model, path):
        model.save_weights(path)

    def load_pretrained(model, path):
        model.load_weights(path)

    class LogsInStep(Predicting):
        def training_step(self, model, batch):
            self.log_metrics({"in_step": 1.0})
            return super().training_step(model, batch)


class Pretrained(Predicting):
    """A model whose weights come from elsewhere (a file of the framework's own format), loaded in build_model
    on rank 0 only, as a download might be: the other ranks' models are as built, until rank 0's are sent."""

    def build_model(self):
        model = super().build_model()
        if self.rank == 0:
            load_pretrained(model, Path(os.environ["HVDAZURE_TEST_OUT"]) / PRETRAINED)
        return model


class LogsEveryStep(Callback):
    """trainer.log_metrics from a callback: 7 on every rank, so the epoch's mean is exactly 7."""

    def on_step_end(self, trainer):
        trainer.log_metrics({"seven": 7.0})


def save(trainer, name: str, predictions) -> None:
    arrays = predictions if isinstance(predictions, dict) else {"all": predictions}
    np.savez(Path(os.environ["HVDAZURE_TEST_OUT"]) / f"predictions-{trainer.rank}-{name}.npz", **arrays)


def refusal(call) -> str | None:
    try:
        call()
    except (ConfigError, CheckpointError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


if __name__ == "__main__":
    config = TrainConfig(epochs=1, batch_size=8, lr=0.05, log_every=1, progress_bar=False,
                         checkpoint_dir=CHECKPOINTS, extra={"n_train": 37, "n_eval": 23},
                         zero_stage=2 if FRAMEWORK == "torch" else 0)
    report = {}
    if MODE == "train":
        trained = Predicting(config, callbacks=[LogsEveryStep()])
        trained.fit()
        report["train_seven"] = trained.state.history[-1].get("train_seven")
        if trained.rank == 0:  # the trained model exported, the example input caught from its own step
            out = Path(os.environ["HVDAZURE_TEST_OUT"])
            trained.export(str(out / ("model.onnx" if FRAMEWORK == "torch" else "model.keras")))
            save_pretrained(trained.model, out / PRETRAINED)  # read by rank 0 only, after this
        save(trained, "trained", trained.predict())
        report["trained_test"] = trained.test()
        last = trained.state.history[-1]
        report["trained_eval"] = {k[len("eval_"):]: v for k, v in last.items() if k.startswith("eval_")}
        loaded = Predicting(config)
        save(loaded, "latest", loaded.predict(checkpoint="latest"))
        report["latest_test"] = loaded.test()
        report["train_dataset_calls"] = [trained.train_dataset_calls, loaded.train_dataset_calls]
        pretrained = Pretrained(config)
        save(pretrained, "pretrained", pretrained.predict())
        report["pretrained_test"] = pretrained.test()
        plain_file = Path(os.environ["HVDAZURE_TEST_OUT"]) / PRETRAINED
        report["plain_file"] = refusal(lambda: Predicting(config).predict(checkpoint=str(plain_file)))
        report["other_model"] = refusal(lambda: OtherModel(config).predict(checkpoint="latest"))
        if FRAMEWORK == "tensorflow":  # training_step runs compiled: log_metrics there is refused
            plain = config.replace(checkpoint_dir=None)
            report["log_in_compiled_step"] = refusal(lambda: LogsInStep(plain).fit())
    else:
        loaded = Predicting(config.replace(checkpoint_dir=None))
        save(loaded, "loaded", loaded.predict(checkpoint=CHECKPOINTS))
        out = Path(os.environ["HVDAZURE_TEST_OUT"])  # and exported from the checkpoint, without a trainer
        if FRAMEWORK == "torch":
            from hvdazure.torch import export

            export(CHECKPOINTS, str(out / "model.pt2"), torch.nn.Linear(3, 1, dtype=torch.float64),
                   (torch.zeros(4, 3, dtype=torch.float64),), format="exported_program")
        else:
            from hvdazure.tensorflow import export

            export(CHECKPOINTS, str(out / "saved_model"), Predicting(config).build_model(), "saved_model")
        report["loaded_test"] = loaded.test()
        report["train_dataset_calls"] = [loaded.train_dataset_calls]
    report_rank(loaded.rank, report)
