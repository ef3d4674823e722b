"""TorchTrainer: the training loop of core/trainer.py on PyTorch and Horovod.

What Horovod's examples make users write by hand, done here: hvd.init and device pinning, thread limits on
CPU, DistributedOptimizer (compression, accumulation, op, predivide), broadcast of parameters and optimizer
state from rank 0, sharded and re-seeded data per epoch, exact loss weighting for uneven last steps,
gradient clipping after the allreduce, and autocast mixed precision (bf16; fp16 with GradScaler on CUDA).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import horovod
import horovod.torch as hvd
import torch
from torch.utils.data import Dataset
from torch.utils.data import default_collate as _default_collate

from hvdazure.core.config import ConfigError
from hvdazure.core.metrics import MetricAccumulator
from hvdazure.core.sharding import MicroBatch
from hvdazure.core.trainer import Trainer
from hvdazure.torch.collectives import TorchCollectives
from hvdazure.torch.data import eval_batches, make_loader, to_device, train_loader
from hvdazure.torch.state import TorchState

_OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}
_COMPRESSION = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TorchTrainer(Trainer):
    """Subclass and implement build_model, build_optimizer, train_dataset and training_step;
    eval_dataset and validation_step for evaluation. Then `fit()`."""

    framework_name = "torch"
    comm: TorchCollectives

    # --- the user's hooks ----------------------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError("implement build_model() -> torch.nn.Module")

    def build_optimizer(self, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """`lr` is already scaled for the global batch; warmup and schedule are applied on top."""
        raise NotImplementedError("implement build_optimizer(params, lr) -> torch.optim.Optimizer")

    def train_dataset(self) -> Dataset:
        """The full, unsharded map-style dataset: hvdazure gives each rank its part."""
        raise NotImplementedError("implement train_dataset() -> torch.utils.data.Dataset")

    def eval_dataset(self) -> Dataset | None:
        return None

    def training_step(self, model: torch.nn.Module, batch: Any) -> torch.Tensor | Mapping[str, Any]:
        """The mean loss over the batch, or a dict with "loss" and other scalar metrics (batch means)."""
        raise NotImplementedError("implement training_step(model, batch) -> loss")

    def validation_step(self, model: torch.nn.Module, batch: Any) -> Mapping[str, Any]:
        """A dict of scalar metrics, each the mean over the batch; hvdazure weights them by batch size."""
        raise NotImplementedError("implement validation_step(model, batch) -> dict (or no eval_dataset)")

    def collate(self, samples: list[Any]) -> Any:
        return _default_collate(samples)

    # --- the binding -------------------------------------------------------------------------------------
    def _init_distributed(self) -> TorchCollectives:
        hvd.init(comm=self.mpi_comm)
        if torch.cuda.is_available():
            torch.cuda.set_device(hvd.local_rank())
            self.device = torch.device("cuda", hvd.local_rank())
        else:
            self.device = torch.device("cpu")
            if "OMP_NUM_THREADS" not in os.environ:  # ranks on one node share its cores
                torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // hvd.local_size()))
        return TorchCollectives(self.device)

    def _shutdown_distributed(self) -> None:
        hvd.shutdown()

    def _load_datasets(self) -> int:
        self._train_data = self.train_dataset()
        self._eval_data = self.eval_dataset()
        return len(self._train_data)

    def _build(self, peak_lr: float) -> None:
        c = self.config
        if c.precision == "fp16" and self.device.type != "cuda":
            raise ConfigError("config field 'precision': 'fp16' needs CUDA (GradScaler); use 'bf16' on CPU")
        torch.manual_seed(c.seed)  # the same initial weights on every rank (rank 0's are broadcast anyway)
        self.model = self.build_model().to(self.device)
        optimizer = self.build_optimizer(self.model.parameters(), peak_lr)
        # Per-group LR multipliers the user set survive warmup/schedule updates.
        self._lr_factors = [group["lr"] / peak_lr for group in optimizer.param_groups]
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=self.model.named_parameters(),
            compression=_COMPRESSION[c.compression], backward_passes_per_step=c.grad_accum_steps,
            op=_OPS[c.reduce_op], gradient_predivide_factor=c.gradient_predivide_factor)
        self.scaler = torch.amp.GradScaler("cuda") if c.precision == "fp16" else None
        self.state_io = TorchState(self.model, self.optimizer, self.scaler, self.device)
        self.seed_everything(c.seed * 1_000_003 + self.rank)  # dropout etc. differ between ranks
        # Average divides the summed gradients by the world size; the loss weights are shares of the whole
        # step, so multiply that division back out.
        self._ranks_averaged = 1 if c.reduce_op == "sum" else self.world_size
        self.micro_batch: MicroBatch | None = None  # being trained on: its sample indices and loss weight
        self._batches: Iterator[Any] | None = None
        self._batches_at: tuple[int, int] | None = None

    def _broadcast_model_and_optimizer(self) -> None:
        if hvd.broadcast_object(bool(self.optimizer.state), root_rank=0, name="hvdazure.has_state"):
            # Horovod's broadcast_optimizer_state initialises an empty state with a zero-gradient step, which
            # can move parameters (weight decay): the parameter broadcast after it puts them back.
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        else:
            # A fresh optimizer has no state to send, only its settings; skipping Horovod's zero-gradient
            # step keeps the first real step exact (Adam's step count, decoupled weight decay).
            settings = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            for group, chosen in zip(self.optimizer.param_groups, hvd.broadcast_object(
                    settings, root_rank=0, name="hvdazure.optimizer_settings"), strict=True):
                group.update(chosen)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

    def set_lr(self, lr: float) -> None:
        for group, factor in zip(self.optimizer.param_groups, self._lr_factors, strict=True):
            group["lr"] = lr * factor

    def _autocast(self) -> contextlib.AbstractContextManager:
        precision = self.config.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=_AMP_DTYPES[precision])

    def _collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """The user's `collate`, or None for the default (which data.loader may do faster, batch-wise)."""
        return None if type(self).collate is TorchTrainer.collate else self.collate

    def _step_batches(self, micro_batches: list[MicroBatch]) -> Iterator[Any]:
        """This rank's batches of the current step, on the device (None for an empty micro-batch). The
        loader is made afresh when training is not where the previous step left it: a new epoch, or a
        resume point."""
        s = self.state
        if self._batches is None or self._batches_at != (s.epoch, s.step_in_epoch):
            loader = train_loader(self._train_data, self.plan, s.epoch, s.samples_in_epoch,
                                  self._collate_fn(), self.config.num_workers,
                                  pin_memory=self.device.type == "cuda")
            self._batches = iter(loader)
        for micro_batch in micro_batches:
            yield None if micro_batch.is_empty else to_device(next(self._batches), self.device)
        self._batches_at = (s.epoch, s.step_in_epoch + 1)

    def _run_step(self, micro_batches: list[MicroBatch], meter: MetricAccumulator,
                  stop_vote: float | None) -> float:
        votes = None if stop_vote is None else self.comm.allreduce_sum_async([stop_vote], "stop_vote")
        if not self.model.training:  # after an evaluation (a recursive call; not needed every step)
            self.model.train()
        for micro_batch, batch in zip(micro_batches, self._step_batches(micro_batches), strict=True):
            if batch is None:
                # Nothing to train on: no forward pass (BatchNorm statistics and gradients stay untouched);
                # the optimizer step's synchronize() still allreduces zeros for this rank's gradients.
                continue
            self.micro_batch = micro_batch
            with self._autocast():
                loss, metrics = _loss_and_metrics(self.training_step(self.model, batch))
            weight = micro_batch.loss_weight(self._ranks_averaged)
            scaled = loss if weight == 1.0 else loss * weight  # exactly 1.0 for a full step, no accumulation
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            meter.add({"loss": loss.detach(), **metrics}, len(micro_batch.indices))
        self._optimizer_step()
        return votes()[0] if votes is not None else 0.0

    def _optimizer_step(self) -> None:
        opt, clip = self.optimizer, self.config.grad_clip_norm
        if clip is None and self.scaler is None:
            opt.step()
        else:
            opt.synchronize()  # gradients are averaged across ranks before they are unscaled or clipped
            if self.scaler is not None:
                self.scaler.unscale_(opt)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            with opt.skip_synchronize():
                if self.scaler is not None:
                    self.scaler.step(opt)
                else:
                    opt.step()
            if self.scaler is not None:
                self.scaler.update()
        opt.zero_grad()

    def _evaluate(self, meter: MetricAccumulator) -> bool:
        if self._eval_data is None:
            return False
        # A rank with no evaluation samples (fewer samples than ranks) runs nothing and reports no metric.
        batches = eval_batches(len(self._eval_data), self.config.batch_size, self.world_size, self.rank)
        loader = make_loader(self._eval_data, batches, self._collate_fn(), self.config.num_workers)
        self.model.eval()
        with torch.no_grad(), self._autocast():
            for indices, batch in zip(batches, loader, strict=True):
                metrics = self.validation_step(self.model, to_device(batch, self.device))
                if not isinstance(metrics, Mapping):
                    raise TypeError("validation_step must return a dict of metrics, got "
                                    f"{type(metrics).__name__}")
                meter.add(dict(metrics), len(indices))
        return True

    def _metric_to_float64(self, value: Any) -> Any:
        # On the CPU a metric is read as a Python float: the same float64 arithmetic as torch's, without a
        # cast, multiply and add dispatched per metric and step. On a GPU reading it would wait for the step.
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.detach().to(torch.float64)
        return float(value)

    def _min_samples_per_micro_batch(self) -> tuple[int, str]:
        # BatchNorm1d on (batch, features) inputs raises on a batch of 1 in training; 2d/3d layers have
        # spatial positions to average over and train on one sample.
        for name, module in self.model.named_modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                return 2, f"the model's BatchNorm1d layer {name!r} cannot train on 1 sample"
        return 1, ""

    def framework_versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "horovod": horovod.__version__}


def _loss_and_metrics(output: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Split training_step's output into the loss to differentiate and the metrics to report."""
    if isinstance(output, torch.Tensor):
        return output, {}
    if isinstance(output, Mapping) and "loss" in output:
        metrics = {k: v.detach() if isinstance(v, torch.Tensor) else v
                   for k, v in output.items() if k != "loss"}
        return output["loss"], metrics
    raise TypeError("training_step must return a loss tensor or a dict with 'loss', got "
                    f"{type(output).__name__}")

