"""TorchTrainer: what a PyTorch user subclasses. It holds the user's hooks; its TorchBackend
(torch/backend.py) runs them in core/trainer.py's loop on Horovod."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset
from torch.utils.data import default_collate as _default_collate

from hvdazure.core.callbacks import Callback
from hvdazure.core.config import TrainConfig
from hvdazure.core.script.model_export import Exported
from hvdazure.core.trainer import Trainer
from hvdazure.torch.backend import TorchBackend
from hvdazure.torch.model_export import export_model


class TorchTrainer(Trainer):
    """Subclass and implement build_model, build_optimizer, train_dataset and training_step;
    eval_dataset and validation_step for evaluation. Then `fit()`."""

    def __init__(self, config: TrainConfig | None = None, callbacks: Sequence[Callback] = (),
                 comm: Any = None) -> None:
        """`comm`: an mpi4py communicator to start Horovod on (see core.trainer.Trainer)."""
        user_collate = None if type(self).collate is TorchTrainer.collate else self.collate
        self.__backend = TorchBackend(self, user_collate)
        super().__init__(config, callbacks, comm, backend=self.__backend)

    # --- the user's hooks ----------------------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        """The model; hvdazure moves it to this rank's device and broadcasts rank 0's weights (and compiles
        it with `compile: true`; a model compiled here already is used as it is)."""
        raise NotImplementedError("implement build_model() -> torch.nn.Module")

    def build_optimizer(self, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """`lr` is already scaled for the global batch; warmup and schedule are applied on top."""
        raise NotImplementedError("implement build_optimizer(params, lr) -> torch.optim.Optimizer")

    def train_dataset(self) -> Dataset:
        """The full, unsharded map-style dataset: hvdazure gives each rank its part."""
        raise NotImplementedError("implement train_dataset() -> torch.utils.data.Dataset")

    def eval_dataset(self) -> Dataset | None:
        """The full evaluation dataset (map-style); None (the default): no evaluation."""
        return None

    def training_step(self, model: torch.nn.Module, batch: Any) -> torch.Tensor | Mapping[str, Any]:
        """The mean loss over the batch, or a dict with "loss" and other scalar metrics (batch means)."""
        raise NotImplementedError("implement training_step(model, batch) -> loss")

    def validation_step(self, model: torch.nn.Module, batch: Any) -> Mapping[str, Any]:
        """A dict of scalar metrics, each the mean over the batch; hvdazure weights them by batch size. Runs
        once before training too, on one batch (TrainConfig.sanity_check)."""
        raise NotImplementedError("implement validation_step(model, batch) -> dict (or no eval_dataset)")

    def predict_step(self, model: torch.nn.Module, batch: Any) -> torch.Tensor | Mapping[str, torch.Tensor]:
        """The batch's predictions: a tensor with one row per sample, or a dict of them (for `predict`).
        Runs with the model in eval mode, without gradients."""
        raise NotImplementedError("implement predict_step(model, batch) -> tensor (one row per sample)")

    def predict_dataset(self) -> Dataset | None:
        """The data `predict()` predicts when given none (map-style or a ShardedDataset); default: none."""
        return None

    def test_dataset(self) -> Dataset | None:
        """The data `test()` evaluates when given none; default: eval_dataset()."""
        return self.eval_dataset()

    def collate(self, samples: list[Any]) -> Any:
        """Make a batch of samples; default: torch's default_collate."""
        return _default_collate(samples)

    # --- after training ------------------------------------------------------------------------------------
    def export(self, path: str, format: str = "onnx", example_input: tuple[Any, ...] | None = None,
               ) -> Exported:
        """Export the model (trained by fit(), or loaded by predict/test's checkpoint) to `path`: "onnx"
        (for onnxruntime, Azure ML managed endpoints), "torchscript" or "exported_program" (torch.export).
        The example input to trace is the model's own input on the training data's first batch unless
        given (a tuple of positional inputs); the artifact is reloaded and must compute what the model
        does on it, or nothing is written (torch/model_export.py). Call it on one rank (rank 0)."""
        example = example_input if example_input is not None else self.__backend.example_model_input()
        return export_model(self.model, example, path, format)

    # --- what the hooks may read, once fit() has built them ----------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The model build_model returned, on this rank's device, with rank 0's weights: what the steps are
        given (compiled, with `compile: true`; its `_orig_mod` is the model uncompiled)."""
        return self.__backend.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer build_optimizer returned; where gradients are allreduced during backward (GPUs,
        Adasum, `grad_allreduce: overlap`), Horovod's DistributedOptimizer around it."""
        return self.__backend.optimizer

    @property
    def device(self) -> torch.device:
        """This rank's device: its local GPU under CUDA, else the CPU."""
        return self.__backend.device
