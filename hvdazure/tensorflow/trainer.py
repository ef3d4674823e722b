"""TensorFlowTrainer: what a TensorFlow / Keras 3 user subclasses. It holds the user's hooks; its
TensorFlowBackend (tensorflow/backend.py) runs them in core/trainer.py's loop on horovod.tensorflow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras

from hvdazure.core.callbacks import Callback
from hvdazure.core.config import TrainConfig
from hvdazure.core.metrics import HookReturnError
from hvdazure.core.script.model_export import Exported
from hvdazure.core.trainer import Trainer
from hvdazure.tensorflow.backend import TensorFlowBackend
from hvdazure.tensorflow.model_export import export_model


class TensorFlowTrainer(Trainer):
    """Subclass and implement build_model, build_optimizer, train_dataset and training_step;
    eval_dataset and validation_step for evaluation. Then `fit()`."""

    def __init__(self, config: TrainConfig | None = None, callbacks: Sequence[Callback] = (),
                 comm: Any = None) -> None:
        """`comm`: an mpi4py communicator to start Horovod on (see core.trainer.Trainer)."""
        self.__backend = TensorFlowBackend(self)
        super().__init__(config, callbacks, comm, backend=self.__backend)

    # --- the user's hooks ----------------------------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """A built Keras 3 model (give it a keras.Input, or call model.build(input_shape))."""
        raise NotImplementedError("implement build_model() -> keras.Model")

    def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer:
        """`lr` is already scaled for the global batch; warmup and schedule are applied on top, so pass it
        as a number, not a LearningRateSchedule. With precision fp16 it is wrapped in a keras
        LossScaleOptimizer, unless it is one (its own initial_scale and dynamic_growth_steps)."""
        raise NotImplementedError("implement build_optimizer(lr) -> keras.optimizers.Optimizer")

    def train_dataset(self) -> Any:
        """The full, unsharded data: arrays (a tuple/dict of NumPy arrays or tensors) or a finite tf.data
        Dataset of unbatched samples; hvdazure gives each rank its part and batches it."""
        raise NotImplementedError("implement train_dataset() -> arrays or tf.data.Dataset")

    def eval_dataset(self) -> Any:
        """The full evaluation data, in the forms train_dataset takes; None (the default): no evaluation."""
        return None

    def training_step(self, model: keras.Model, batch: Any) -> Any:
        """The loss, or a dict with "loss" and other metrics: each one number, or one per sample (shape
        (batch,), as Keras's losses and metrics return them), averaged. Runs inside a tf.function: use
        TensorFlow/Keras operations."""
        raise NotImplementedError("implement training_step(model, batch) -> loss")

    def validation_step(self, model: keras.Model, batch: Any) -> Mapping[str, Any]:
        """A dict of metrics, each one number or one per sample (averaged over the batch); hvdazure weights
        them by batch size. Runs once before training too, on one batch (TrainConfig.sanity_check)."""
        raise NotImplementedError("implement validation_step(model, batch) -> dict (or no eval_dataset)")

    def predict_step(self, model: keras.Model, batch: Any) -> Any:
        """The batch's predictions: a tensor with one row per sample, or a dict of them (for `predict`),
        e.g. `model(batch[0], training=False)`. Runs inside a tf.function: use TensorFlow/Keras operations."""
        raise NotImplementedError("implement predict_step(model, batch) -> tensor (one row per sample)")

    def predict_dataset(self) -> Any:
        """The data `predict()` predicts when given none, in the forms train_dataset takes; default: none."""
        return None

    def test_dataset(self) -> Any:
        """The data `test()` evaluates when given none; default: eval_dataset()."""
        return self.eval_dataset()

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """As Trainer.log_metrics, from a callback: training_step runs compiled (a tf.function), where a
        Python call would run once, when it is traced; return its metrics in training_step's dict."""
        import tensorflow as tf

        if tf.inside_function():
            raise HookReturnError("log_metrics inside training_step, which runs compiled (tf.function): "
                                  "return the metric in training_step's dict instead")
        super().log_metrics(metrics)

    # --- after training ------------------------------------------------------------------------------------
    def export(self, path: str, format: str = "keras", example_input: Any = None) -> Exported:
        """Export the model (trained by fit(), or loaded by predict/test's checkpoint) to `path`: "keras" (a
        .keras file) or "saved_model" (a TensorFlow SavedModel directory). The artifact is reloaded and must
        compute what the model does on `example_input`, or nothing is written (tensorflow/model_export.py).
        The example is the model's own input on the training data's first batch unless given (the model's
        input: an array, a list of them for several inputs). Call it on one rank (rank 0)."""
        example = example_input if example_input is not None else self.__backend.example_model_input()
        return export_model(self.model, path, format, example)

    # --- what the hooks may read, once fit() has built them ----------------------------------------------
    @property
    def model(self) -> keras.Model:
        """The model build_model returned, with every rank's weights equal to rank 0's."""
        return self.__backend.model

    @property
    def optimizer(self) -> keras.optimizers.Optimizer:
        """The optimizer build_optimizer returned (with precision fp16, a LossScaleOptimizer around it
        unless it was one)."""
        return self.__backend.optimizer
