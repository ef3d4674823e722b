"""TorchBackend: the framework's side of core/trainer.py's loop, on PyTorch and Horovod.

What Horovod's examples make users write by hand, done here: hvd.init and device pinning, thread limits on
CPU, the gradient allreduce (torch/gradients.py: Horovod's DistributedOptimizer during backward on GPUs,
one grouped allreduce after it on CPUs; compression, accumulation, op, predivide), broadcast of parameters
and optimizer state from rank 0, sharded and re-seeded data per epoch, exact loss weighting for uneven
last steps, gradient clipping after the allreduce, autocast mixed precision (bf16; fp16 with a GradScaler on
the rank's device, its overflows skipped on every rank alike: the gradients are allreduced before they are
unscaled), and torch.compile (checkpoints keep the uncompiled model's keys: torch/checkpoint_content.py).
The user's hooks (build_model, training_step, ...) are the TorchTrainer's (torch/trainer.py), called
through `TorchHooks`: this module does not import the trainer.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import horovod
import horovod.torch as hvd
import numpy as np
import torch

from hvdazure.core.backend import Backend, RankStep, UserHooks
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.devices import place_rank
from hvdazure.core.metrics import HookReturnError, MetricAccumulator, check_metric_shape
from hvdazure.core.nonfinite import FIRST_GRADIENTS_STEP, FIRST_LOSS, FIRST_LOSS_STEP, RECORD, SKIPPED_STEPS
from hvdazure.core.rank_logging import logger
from hvdazure.core.sample_plan import SampleOrder, first_eval_batch
from hvdazure.core.script.model_export import ExportError
from hvdazure.core.step_batches import StepCursor
from hvdazure.core.step_times import no_device
from hvdazure.data.prediction_output import PredictionShards
from hvdazure.torch.checkpoint_content import (
    MODEL_FILE,
    TorchCheckpointContent,
    load_mapped,
    load_model_state,
    nonfinite_probe,
    original_module,
)
from hvdazure.torch.collectives import TorchCollectives
from hvdazure.torch.data import DataView, data_view, empty_batch, epoch_loader, eval_batches, to_device
from hvdazure.torch.gradients import COMPRESSION, OPS, GradientsAfterBackward, overlaps_backward
from hvdazure.torch.model_export import FORMATS
from hvdazure.torch.profiler import CudaStats, TorchProfiler
from hvdazure.torch.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm, has_sync_batchnorm
from hvdazure.torch.zero import ShardedOptimizer

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TorchHooks(UserHooks, Protocol):
    """The user's hooks TorchBackend calls: core's UserHooks and PyTorch's build_optimizer. TorchTrainer
    (torch/trainer.py) fills it."""

    def build_optimizer(self, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer: ...


class TorchBackend(Backend):
    """Runs a TorchTrainer's hooks on Horovod. `collate`: the user's, or None for the default (which
    data.make_loader may do faster, batch-wise)."""

    framework_name = "torch"

    def __init__(self, user: TorchHooks, collate: Callable[[list[Any]], Any] | None) -> None:
        self.user, self.collate = user, collate
        self.model: torch.nn.Module  # what the steps call: compiled with `compile: true`
        self.uncompiled: torch.nn.Module  # the model without torch.compile's wrapper: its parameters, state
        self.optimizer: torch.optim.Optimizer  # Horovod's DistributedOptimizer around the user's
        self.scaler: torch.amp.GradScaler | None = None
        self.device = torch.device("cpu")
        self._eval_data: DataView | None = None
        self._cuda_stats: CudaStats | None = None  # on a GPU: its numbers for the step times

    def _start(self, comm: Any) -> TorchCollectives:
        hvd.init(comm=comm)
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        placement = place_rank(hvd.local_rank(), hvd.local_size(), visible,
                               os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.device_layout = placement.layout(hvd.size(), hvd.cross_size())
        if placement.index is not None:
            torch.cuda.set_device(placement.index)
            self.device = torch.device("cuda", placement.index)
            self._cuda_stats = CudaStats(self.device)
        else:
            self.device = torch.device("cpu")
            if "OMP_NUM_THREADS" not in os.environ:  # ranks on one node share its cores
                torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // hvd.local_size()))
        self.collectives = TorchCollectives(self.device)
        return self.collectives

    def shutdown(self) -> None:
        hvd.shutdown()

    def load_datasets(self) -> SampleOrder:
        self._train_data: DataView = data_view(self.user.train_dataset(), "train_dataset()")
        eval_data = self.user.eval_dataset()
        self._eval_data = data_view(eval_data, "eval_dataset()") if eval_data is not None else None
        return self._train_data.order

    def data_fingerprint(self) -> str | None:
        return self._train_data.data_fingerprint

    def build(self, peak_lr: float) -> TorchCheckpointContent:
        c = self.config
        self._in_backward = (overlaps_backward(c.grad_allreduce, c.reduce_op, self.device)
                             and not c.zero_stage)
        _refuse_a_loss_scaler_with_adasum(c)
        torch.manual_seed(c.seed)  # the same initial weights on every rank (rank 0's are broadcast anyway)
        self.model = self.user.build_model()
        if c.sync_batchnorm:
            self.model = convert_sync_batchnorm(self.model)
        self.model = self.model.to(self.device)
        self.uncompiled = original_module(self.model)
        if c.compile:
            self.model = _compiled(self.model, c.compile_mode)
        # Synchronized BatchNorm layers meet across ranks in every forward pass: a rank without samples in a
        # micro-batch runs one on an empty batch (loss weight 0) instead of none.
        self._forward_empty = hvd.size() > 1 and has_sync_batchnorm(self.model)
        self._empty_batch: Any = None
        optimizer = self.user.build_optimizer(self.uncompiled.parameters(), peak_lr)
        # Per-group LR multipliers the user set survive warmup/schedule updates.
        self._lr_factors = [group["lr"] / peak_lr for group in optimizer.param_groups]
        self.sharded: ShardedOptimizer | None = None
        self._allreduce_gradients: Callable[[], None]
        if c.zero_stage:  # the user's optimizer, stepping this rank's slice (torch/zero.py)
            self.optimizer = optimizer
            self.sharded = ShardedOptimizer(optimizer, c.zero_stage, c.reduce_op, c.compression,
                                            c.gradient_predivide_factor, self.device,
                                            int(c.zero_bucket_mb * 2**20))
            self._allreduce_gradients = self.sharded.exchange
        elif self._in_backward:
            self.optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=self.uncompiled.named_parameters(),
                compression=COMPRESSION[c.compression], backward_passes_per_step=c.grad_accum_steps,
                op=OPS[c.reduce_op], gradient_predivide_factor=c.gradient_predivide_factor)
            self._allreduce_gradients = self.optimizer.synchronize
        else:
            self.optimizer = optimizer
            self._allreduce_gradients = GradientsAfterBackward(
                self.uncompiled.parameters(), c.reduce_op, c.compression, c.gradient_predivide_factor)
        # on_nan_loss 'skip' skips a step whose gradients are not finite the way fp16's loss scaling skips an
        # overflowing one: by a GradScaler, held at a scale of 1 outside fp16. One mechanism, not two.
        self._scale_of_one = c.on_nan_loss == "skip" and c.precision != "fp16"
        self.scaler = (torch.amp.GradScaler(self.device.type, init_scale=1.0) if self._scale_of_one else
                       torch.amp.GradScaler(self.device.type) if c.precision == "fp16" else None)
        self._trained = [p for p in self.uncompiled.parameters() if p.requires_grad]
        self._nonfinite = _NonFiniteRecord(self.device)
        return TorchCheckpointContent(self.uncompiled, self.optimizer, self.scaler, self.device, self.sharded)

    def broadcast_model_and_optimizer(self) -> None:
        if self.sharded is not None and self.sharded.scatter():  # a checkpoint's state, a slice to each rank
            hvd.broadcast_parameters(self.uncompiled.state_dict(), root_rank=0)
            return
        if self.sharded is None and hvd.broadcast_object(bool(self.optimizer.state), root_rank=0,
                                                         name="hvdazure.has_state"):
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
        hvd.broadcast_parameters(self.uncompiled.state_dict(), root_rank=0)

    def set_lr(self, lr: float) -> None:
        for group, factor in zip(self.optimizer.param_groups, self._lr_factors, strict=True):
            group["lr"] = lr * factor

    def _autocast(self) -> contextlib.AbstractContextManager:
        precision = self.config.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=_AMP_DTYPES[precision])

    def epoch_batches(self, steps: StepCursor) -> Iterator[Any]:
        loader = epoch_loader(self._train_data, steps, self.collate, self.config.num_workers,
                              pin_memory=self.device.type == "cuda")
        return (to_device(batch, self.device) for batch in loader)

    def run_step(self, step: RankStep, meter: MetricAccumulator, stop_vote: float | None) -> float:
        votes = None if stop_vote is None else self.collectives.allreduce_sum_async([stop_vote], "stop_vote")
        if not self.model.training:  # after an evaluation (a recursive call; not needed every step)
            self.model.train()
        times = self.clock
        last = len(step.micro_batches) - 1
        for i, (micro_batch, batch, weight) in enumerate(step):  # each batch's wait is timed as it is taken
            since = times.now()
            if batch is None:
                if not self._forward_empty:
                    # Nothing to train on: no forward pass (BatchNorm statistics and gradients stay
                    # untouched); the optimizer step's synchronize() still allreduces zeros for this rank.
                    continue
                batch = self._no_samples()  # its synchronized BatchNorm layers must meet the other ranks'
            self.micro_batch = micro_batch
            with self._autocast():
                loss, metrics = _loss_and_metrics(self.user.training_step(self.model, batch))
            scaled = loss if weight == 1.0 else loss * weight  # exactly 1.0 for a full step, no accumulation
            if self.sharded is not None:  # stage 2 reduce-scatters during the step's last backward
                self.sharded.arm(last_backward=i == last)
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            if not micro_batch.is_empty:  # an empty batch's mean loss is NaN, and counts for nothing
                detached = loss.detach()
                self._nonfinite.loss(step.number, detached)
                if self.config.on_nan_loss != "skip" or math.isfinite(float(detached)):  # skip: finite only
                    meter.add({"loss": detached, **metrics}, len(micro_batch.indices))
            if times.enabled and self.device.type == "cuda":
                # the kernels queued by backward, charged to it rather than to the allreduce wait that
                # would otherwise absorb them (the exchange waits for the gradients anyway)
                torch.cuda.synchronize(self.device)
            times.add("compute", since)
        self._optimizer_step(step.number)
        since = times.now()
        vote = votes()[0] if votes is not None else 0.0
        times.add("exchange", since)
        return vote

    def _no_samples(self) -> Any:
        """A training batch of no samples, in the structure of the data's batches (made once, of sample 0)."""
        if self._empty_batch is None:
            self._empty_batch = to_device(empty_batch(self._train_data, self.collate), self.device)
        return self._empty_batch

    def _optimizer_step(self, number: int) -> None:
        opt, clip, times = self.optimizer, self.config.grad_clip_norm, self.clock
        since = times.now()
        # averaged across ranks before they are unscaled or clipped: a rank's overflow (inf) reaches every
        # rank, whose scalers then skip the same step and lower the same scale alike
        self._allreduce_gradients()
        since = times.add("exchange", since)
        sharded = self.sharded
        if sharded is not None:  # a slice's NaN or inf, known to every rank (whose scalers then skip alike)
            probe = sharded.global_probe(nonfinite_probe(sharded.shard_gradients()))
            if self.scaler is not None and not math.isfinite(float(probe)):
                sharded.poison()
        if self.scaler is not None:
            self.scaler.unscale_(opt)
        if sharded is None:  # NaN or inf if any gradient is (a loss scaler skips such a step: then counted)
            probe = nonfinite_probe([p.grad for p in self._trained if p.grad is not None])
        self._nonfinite.gradients(number, probe, skipped=self.scaler is not None)
        if clip is not None and sharded is not None:
            sharded.clip_(clip)
        elif clip is not None:
            torch.nn.utils.clip_grad_norm_(self.uncompiled.parameters(), clip)
        # Horovod's DistributedOptimizer would synchronize again in step(); Adasum's step is its allreduce
        synchronized = self._in_backward and self.config.reduce_op != "adasum"
        with opt.skip_synchronize() if synchronized else contextlib.nullcontext():
            if self.scaler is not None:
                self.scaler.step(opt)
            else:
                opt.step()
        if self.scaler is not None:
            self.scaler.update(new_scale=1.0 if self._scale_of_one else None)
        if sharded is not None:
            since = times.add("optimizer", since)
            sharded.zero_grad()  # first: the gradients' memory is free for the allgather's
            sharded.gather_weights()  # every rank's updated slice into every rank's parameters
            times.add("gather", since)
            return
        opt.zero_grad()
        times.add("optimizer", since)

    def evaluate(self, meter: MetricAccumulator, first_batch_only: bool = False, data: Any = None) -> bool:
        data = data if data is not None else self._eval_data
        if data is None:
            return False
        # A rank with no evaluation samples (fewer samples than ranks) runs nothing and reports no metric.
        c, size, rank = self.config, self.collectives.size, self.collectives.rank
        if first_batch_only:
            first = first_eval_batch(len(data), c.batch_size, size, rank)
            batches = [list(first)] if first else []
        else:
            batches = eval_batches(len(data), c.batch_size, size, rank)
        # first_batch_only: the modes the model had are put back (run_step sets them after evaluations)
        with self._inference(keep_modes=first_batch_only):
            for indices, batch in self._inference_batches(data, batches, workers=not first_batch_only):
                metrics = self.user.validation_step(self.model, batch)
                if not isinstance(metrics, Mapping):
                    raise HookReturnError("validation_step must return a dict of metrics, got "
                                          f"{type(metrics).__name__}")
                meter.add(dict(metrics), len(indices))
        return True

    def inference_data(self, dataset: Any, purpose: str) -> DataView:
        return data_view(dataset, f"{purpose}(dataset)")

    def predict(self, data: DataView, batches: list[range]) -> Iterator[Any]:
        with self._inference(keep_modes=True):
            for _, batch in self._inference_batches(data, [list(b) for b in batches], workers=True):
                yield self.user.predict_step(self.model, batch)

    def example_model_input(self) -> tuple[Any, ...]:
        """The model's positional inputs on the training data's first batch, as the user's own step gives
        them (predict_step's, else validation_step's, else training_step's first forward call, caught by
        a hook; nothing of it is kept), for tracing an export."""
        if not hasattr(self, "model"):
            raise ExportError("export() needs the model built: after fit(), or predict()/test() with a "
                              "checkpoint; or use hvdazure.torch.export(checkpoint, path, model, example)")
        data = getattr(self, "_train_data", None) or data_view(self.user.train_dataset(), "train_dataset()")
        first = list(range(min(len(data), max(2, self.config.batch_size))))
        seen: list[tuple[Any, ...]] = []

        def capture(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            if not seen:
                seen.append(tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args))

        handle = self.uncompiled.register_forward_pre_hook(capture)  # the steps call it uncompiled here
        try:
            with self._inference(keep_modes=True):
                for _, batch in self._inference_batches(data, [first], workers=False):
                    for step in (self.user.predict_step, self.user.validation_step, self.user.training_step):
                        with contextlib.suppress(NotImplementedError):
                            step(self.uncompiled, batch)
                            break
        finally:
            handle.remove()
        if not seen:
            raise ExportError("no step called the model on the training data's first batch: give export() "
                              "an example_input")
        return seen[0]

    def output_as_numpy(self, value: Any) -> np.ndarray:
        """A predict_step output copied to the host as NumPy (bf16, which NumPy lacks, as float32)."""
        if not isinstance(value, torch.Tensor):
            return np.asarray(value)
        value = value.detach()
        return (value.float() if value.dtype == torch.bfloat16 else value).cpu().numpy()

    def prediction_writer(self, output: str) -> PredictionShards:
        return PredictionShards(output)

    model_file = MODEL_FILE
    export_formats = FORMATS

    def load_model_file(self, path: str) -> None:
        try:
            load_model_state(self.uncompiled, load_mapped(path, self.device))
        except RuntimeError as exc:  # torch's message lists every key and shape; its first two lines say
            raise ValueError(" ".join(line.strip() for line in str(exc).strip().splitlines()[:2])) from None

    @contextlib.contextmanager
    def _inference(self, keep_modes: bool) -> Iterator[None]:
        """The model in eval mode, without gradients, under the config's autocast; with `keep_modes`, each
        module's train/eval mode as it was afterwards."""
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                yield
        finally:
            if keep_modes:
                for module, training in modes:
                    module.training = training

    def _inference_batches(self, data: DataView, batches: list[list[int]],
                           workers: bool) -> Iterator[tuple[list[int], Any]]:
        """Each of `batches` with its batch of `data` on the device; with `workers`, loaded by the config's
        num_workers (none are started for the sanity check's one batch)."""
        data.read_ahead(i for batch in batches for i in batch)  # sharded: its first shards, now
        loader = data.loader(batches, self.collate, self.config.num_workers if workers else 0)
        for indices, batch in zip(batches, loader, strict=True):
            yield indices, to_device(batch, self.device)

    def nonfinite_record(self) -> list[Any]:
        return self._nonfinite.values

    def metric_to_float64(self, value: Any) -> Any:
        # On the CPU a metric is read as a Python float: the same float64 arithmetic as torch's, without a
        # cast, multiply and add dispatched per metric and step. On a GPU reading it would wait for the step.
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.detach().to(torch.float64)
        return float(value)

    def min_samples_per_micro_batch(self) -> tuple[int, str, bool]:
        # BatchNorm1d on (batch, features) inputs raises on a batch of 1 in training; 2d/3d layers have
        # spatial positions to average over and train on one sample. A synchronized one needs 2 samples in
        # the micro-batch of all ranks together, so one sample per rank is fine.
        for name, module in self.uncompiled.named_modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                return 2, f"the model's BatchNorm1d layer {name!r} cannot train on 1 sample", False
        for name, module in self.uncompiled.named_modules():
            if isinstance(module, SyncBatchNorm) and module.batchnorm1d:
                why = f"the model's synchronized BatchNorm1d layer {name!r} cannot train on 1 sample"
                return 2, why, True
        return 1, "", False

    def framework_versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "horovod": horovod.__version__}

    def step_profiler(self) -> TorchProfiler:
        return TorchProfiler(self.device)

    def device_stats(self) -> tuple[float, float, float]:
        return self._cuda_stats() if self._cuda_stats is not None else no_device()


def _refuse_a_loss_scaler_with_adasum(c: TrainConfig) -> None:
    """A ConfigError for a GradScaler (fp16, on_nan_loss 'skip') with Adasum: Horovod's Adasum optimizer
    applies each parameter's step in its backward hook, from this rank's own gradient, so neither can the
    scale be taken off first nor a step whose gradients are not finite be skipped (a rank that skips it
    breaks Horovod's optimizer: an AssertionError, every rank stopped)."""
    if c.reduce_op != "adasum":
        return
    why = "Horovod's Adasum optimizer steps each parameter during backward, before"
    if c.precision == "fp16":
        raise ConfigError(f"config field 'precision': 'fp16' cannot be used with reduce_op 'adasum' ({why} "
                          "the loss scale can be taken off its gradient); use 'bf16', or reduce_op 'average'")
    if c.on_nan_loss == "skip":
        raise ConfigError(f"config field 'on_nan_loss': 'skip' cannot be used with reduce_op 'adasum' ({why} "
                          "a step whose gradients are not finite can be skipped); use 'stop', or reduce_op "
                          "'average'")


def _compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """`model` compiled by torch.compile in `mode` (config field compile_mode), or as it is if build_model
    compiled it already (compiling a compiled model again would only wrap it twice)."""
    if original_module(model) is not model:
        logger.info("compile: build_model() returned a compiled model (torch.compile); it is used as it is")
        return model
    return torch.compile(model, mode=mode)


class _NonFiniteRecord:
    """This rank's record of its non-finite steps (core/nonfinite.py's RECORD) where the loss is: on a GPU
    as device scalars updated with torch.where, so that nothing waits for the GPU; on the CPU as numbers
    (a loss on the CPU is read as fast as one tensor operation is dispatched)."""

    def __init__(self, device: torch.device) -> None:
        self.on_host = device.type == "cpu"
        self.values: list[Any] = [0.0] * len(RECORD) if self.on_host else [
            torch.zeros((), dtype=torch.float64, device=device) for _ in RECORD]

    def loss(self, step: int, loss: torch.Tensor) -> None:
        """A micro-batch's mean loss at optimizer step `step`: its first non-finite one is kept."""
        v = self.values
        if self.on_host:
            if not v[FIRST_LOSS_STEP] and not math.isfinite(value := float(loss)):
                v[FIRST_LOSS_STEP], v[FIRST_LOSS] = float(step), value
            return
        first = (v[FIRST_LOSS_STEP] == 0) & ~torch.isfinite(loss)
        v[FIRST_LOSS_STEP] = torch.where(first, step, v[FIRST_LOSS_STEP])
        v[FIRST_LOSS] = torch.where(first, loss.to(torch.float64), v[FIRST_LOSS])

    def gradients(self, step: int, probe: torch.Tensor | float, skipped: bool) -> None:
        """The step's allreduced gradients' `nonfinite_probe` (NaN or inf: one is not finite); `skipped`: a
        loss scaler skips such a step (fp16, on_nan_loss 'skip'), which is counted; else the first is kept."""
        v, at = self.values, SKIPPED_STEPS if skipped else FIRST_GRADIENTS_STEP
        if self.on_host or not isinstance(probe, torch.Tensor):
            if not math.isfinite(float(probe)) and (skipped or not v[at]):
                v[at] = v[at] + 1 if skipped else float(step)
            return
        bad = ~torch.isfinite(probe)
        v[at] = v[at] + bad if skipped else torch.where(bad & (v[at] == 0), step, v[at])


def _loss_and_metrics(output: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Split training_step's output into the loss to differentiate (one number: checked before backward,
    which would name neither the hook nor the shape) and the metrics to report."""
    if isinstance(output, torch.Tensor):
        loss, metrics = output, {}
    elif isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
        metrics = {k: v.detach() if isinstance(v, torch.Tensor) else v
                   for k, v in output.items() if k != "loss"}
    else:
        raise HookReturnError("training_step must return a loss tensor or a dict with 'loss', got "
                              f"{type(output).__name__}")
    check_metric_shape("training_step", "loss", tuple(getattr(loss, "shape", ())))
    return loss, metrics

