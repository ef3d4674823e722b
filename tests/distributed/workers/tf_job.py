"""A small, exactly reproducible TensorFlowTrainer job: linear regression in float64 (Keras 3) on synthetic
data; the TensorFlow twin of torch_job.py (the same data, drawn from the same seeds).

Configured through TrainConfig's CLI (`--set batch_size=4 --set extra.n_train=37 ...`). Each rank reports its
final weights (model.get_weights), their sha256, the history, the sample indices it trained on per epoch (in
order, read from the batches the compiled step received), the LR the optimizer held at every optimizer step,
and how often training_step and validation_step were traced into a tf.function.

extra: n_train, n_eval, features, step_sleep (seconds per step, to make a job slow enough to interrupt),
       autograph_log (print every function AutoGraph converts, with tf.autograph.set_verbosity),
       load_weights (after training, rank 0 also reports the weights of a new model given
       `load_weights(checkpoint_dir, which)` by set_weights, for which in latest and best),
       loss_scale (build_optimizer returns a keras LossScaleOptimizer of this initial scale),
       overflow_rank and overflow_step (at that optimizer step, counted from 1, that rank's gradients are
       multiplied by 1e6, its loss unchanged: with precision fp16 they overflow float16). Each rank also
       reports the loss scale after every step (with a LossScaleOptimizer).
Each rank writes pid-<rank> into HVDAZURE_TEST_OUT when training starts. Several trainings in one job:
`tf_job.py --runs RUNS.json` (workers/_report.py `main`).
"""

import hashlib
import os
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from _report import main, report_rank, step_times
from squatter import squatting

from hvdazure import Callback, TrainConfig
from hvdazure.tensorflow import TensorFlowTrainer, load_weights

keras.config.set_floatx("float64")  # weights, optimizer variables (the LR among them) and losses in float64


def regression(n: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sample index, x, y), float64; the same numbers as torch_job.py's Regression(n, features, seed)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features))
    w = rng.normal(size=(features, 1))
    y = x @ w + 0.1 * rng.normal(size=(n, 1))
    return np.arange(n, dtype=np.int64), x, y


class Recorder(Callback):
    """Records the LR the optimizer holds during each step (what the compiled update reads)."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.loss_scales: list[float] = []

    def on_step_begin(self, trainer) -> None:
        extra = trainer.config.extra
        if "overflow_step" not in extra:
            return
        overflow = trainer.rank == extra.get("overflow_rank") and trainer.state.step + 1 == extra.get(
            "overflow_step")
        trainer.gradient_factor.assign(1e6 if overflow else 1.0)

    def on_train_start(self, trainer) -> None:
        (Path(os.environ["HVDAZURE_TEST_OUT"]) / f"pid-{trainer.rank}").write_text(str(os.getpid()))

    def on_step_end(self, trainer) -> None:
        time.sleep(trainer.config.extra.get("step_sleep", 0))
        self.lrs.append(float(trainer.optimizer.learning_rate.numpy()))
        if isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer):
            self.loss_scales.append(float(trainer.optimizer.dynamic_scale.numpy()))


class RegressionTrainer(TensorFlowTrainer):
    def __init__(self, config: TrainConfig, callbacks=()) -> None:
        self.recorder = Recorder()
        super().__init__(config, callbacks=[self.recorder, *callbacks])
        self.seen: dict[int, list[int]] = {}
        self.not_the_planned_batch = 0  # batches whose indices differ from trainer.micro_batch's
        self.traces = {"training_step": 0, "validation_step": 0}
        self.gradient_factor = tf.Variable(1.0, dtype=tf.float64, trainable=False)  # extra.overflow_step

    def build_model(self):
        features = self.config.extra.get("features", 3)
        return keras.Sequential([keras.Input((features,)), keras.layers.Dense(1)])

    def build_optimizer(self, lr):
        optimizer = keras.optimizers.SGD(learning_rate=lr)
        scale = self.config.extra.get("loss_scale")
        return optimizer if scale is None else keras.optimizers.LossScaleOptimizer(optimizer, scale)

    def train_dataset(self):
        extra = self.config.extra
        return regression(extra.get("n_train", 37), extra.get("features", 3), seed=1)

    def eval_dataset(self):
        n_eval = self.config.extra.get("n_eval")
        return regression(n_eval, self.config.extra.get("features", 3), seed=2) if n_eval else None

    def training_step(self, model, batch):
        index, x, y = batch
        self.traces["training_step"] += 1  # Python code here runs when the step is traced, not per call
        if not self.config.compile:  # XLA cannot compile a py_function: no `seen` with compile: true
            tf.py_function(self._record_indices, [index], [])  # runs at every call of the compiled step
        loss = keras.ops.mean(keras.ops.square(keras.ops.subtract(model(x, training=True), y)))
        if "overflow_step" in self.config.extra:  # the same value; its gradients x gradient_factor
            loss += (self.gradient_factor - 1.0) * (loss - tf.stop_gradient(loss))
        return loss

    def _record_indices(self, index: tf.Tensor) -> None:
        indices = index.numpy().tolist()
        self.seen.setdefault(self.state.epoch, []).extend(indices)
        self.not_the_planned_batch += indices != self.micro_batch.indices

    def validation_step(self, model, batch):
        index, x, y = batch
        self.traces["validation_step"] += 1
        return {"mse": keras.ops.mean(keras.ops.square(keras.ops.subtract(model(x, training=False), y))),
                "index": keras.ops.mean(keras.ops.cast(index, "float64"))}


def loaded_weights(trainer: RegressionTrainer) -> dict[str, list[list[float]]]:
    """What a new model holds after set_weights(load_weights(...)) of the latest and the best checkpoint."""
    loaded = {}
    for which in ("latest", "best"):
        model = trainer.build_model()
        model.set_weights(load_weights(trainer.config.checkpoint_dir, which))
        loaded[which] = [w.flatten().tolist() for w in model.get_weights()]
    return loaded


def train_and_report(argv: list[str] | None = None) -> None:
    """One training configured by `argv` (`--set ...`), reported into HVDAZURE_TEST_OUT."""
    config = TrainConfig.from_cli(argv, log_every=1, progress_bar=False)
    trainer = (squatting(RegressionTrainer) if config.extra.get("squat") else RegressionTrainer)(config)
    if trainer.config.extra.get("autograph_log"):
        tf.autograph.set_verbosity(1, alsologtostdout=True)
    history = trainer.fit()
    weights = trainer.model.get_weights()
    report_rank(trainer.rank, {
        "world_size": trainer.world_size,
        "params": [w.flatten().tolist() for w in weights],
        "dtypes": sorted({str(w.dtype) for w in weights}),
        "params_sha256": hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest(),
        "history": history,
        "squat_intact": trainer.squat_intact() if config.extra.get("squat") else None,
        "seen": {str(k): v for k, v in trainer.seen.items()},
        "not_the_planned_batch": trainer.not_the_planned_batch,
        "lrs": trainer.recorder.lrs,
        "loss_scales": trainer.recorder.loss_scales,
        "steps_per_epoch": trainer.steps_per_epoch,
        "traces": trainer.traces,
        "output_dir": trainer.config.output_dir,
        "step_times": step_times(trainer),
        **({"loaded": loaded_weights(trainer)} if trainer.is_main and trainer.config.extra.get("load_weights")
           else {}),
    })


if __name__ == "__main__":
    main(train_and_report)
