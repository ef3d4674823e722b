"""The GPU check's training job: a small user script on hvdazure's public API, one row of the check per run.

    hvdazure run -np 1 scripts/gpu_check/job.py --set precision=bf16

An MLP with a BatchNorm layer on a fixed synthetic 4-class set (no download, no scikit-learn), trained for a
few steps on whatever device hvdazure gives the rank (cuda:<local rank> under CUDA, else the CPU). Each rank
writes what it saw to `$GPU_CHECK_OUT/report-<rank>.json` for scripts/gpu_check.py to judge: the device, the
history, a SHA-256 of the final weights (the resume row compares it with an uninterrupted run's), the class
of the BatchNorm layer, and what `predict` and `export` returned.

extra: crash_at_step (every rank exits 17 at the end of that optimizer step: the interruption the resume row
       recovers from; use with checkpoint_async=false so the checkpoint before it is whole),
       predict (true: predict the evaluation set after fit), export (comma-separated formats to export to
       after fit, on rank 0: onnx, torchscript, exported_program).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from hvdazure import Callback, TrainConfig
from hvdazure.torch import TorchTrainer

FEATURES, CLASSES = 16, 4


def synthetic(n: int, seed: int) -> TensorDataset:
    """n samples of a fixed 4-class problem: the same tensors on every rank and in every run."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen)
    w = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(x, (x @ w).argmax(dim=1))


class CrashAt(Callback):
    """Ends every rank's process abruptly at the end of one optimizer step, as a lost node would."""

    def on_step_end(self, trainer) -> None:
        if trainer.state.step == trainer.config.extra.get("crash_at_step"):
            os._exit(17)


class CheckTrainer(TorchTrainer):
    """Linear-BatchNorm-ReLU-Linear on the synthetic set; hvdazure places, wraps and converts it."""

    def build_model(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, CLASSES))

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    def train_dataset(self):
        return synthetic(256, seed=1)

    def eval_dataset(self):
        return synthetic(64, seed=2)

    def training_step(self, model, batch):
        self.step_model_class = type(model).__name__  # OptimizedModule under `compile: true`
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    def validation_step(self, model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, y),
                "accuracy": (logits.argmax(dim=1) == y).float().mean()}

    def predict_step(self, model, batch):
        x, _ = batch
        return torch.softmax(model(x).float(), dim=1)


def weights_sha256(model: torch.nn.Module) -> str:
    """A digest of every parameter and buffer, by name, in bytes: equal only for bit-identical weights."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    """Train, then predict and export if asked; each rank reports into $GPU_CHECK_OUT."""
    # bit-identical runs on a GPU need cuBLAS's deterministic workspace and deterministic kernels (a warning,
    # not an error, for an operation that has none: the resume row's comparison then says whether it mattered)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    config = TrainConfig.from_cli(epochs=2, batch_size=32, lr=0.05, log_every=4, progress_bar=False)
    trainer = CheckTrainer(config, callbacks=[CrashAt()])
    start = time.perf_counter()
    history = trainer.fit()
    report: dict = {
        "rank": trainer.rank, "size": trainer.world_size, "device": str(trainer.device),
        "cuda_device_name": (torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda"
                             else None),
        "precision": config.precision, "fit_s": round(time.perf_counter() - start, 3),
        "history": history, "weights_sha256": weights_sha256(trainer.model),
        "batchnorm_class": type(_unwrapped(trainer.model)[1]).__name__,
        "steps": trainer.state.step, "step_model_class": trainer.step_model_class,
    }
    if config.extra.get("predict"):
        predictions = trainer.predict(trainer.eval_dataset())
        report["predict_shape"] = list(predictions.shape)
        report["predict_rows_sum_to_1"] = bool(abs(predictions.sum(axis=1) - 1).max() < 1e-3)
    formats = [f for f in str(config.extra.get("export", "")).split(",") if f]
    if formats and trainer.is_main:
        out = Path(os.environ["GPU_CHECK_OUT"])
        report["exported"] = {}
        for fmt in formats:
            exported = trainer.export(str(out / f"model.{fmt}"), format=fmt)
            report["exported"][fmt] = {"path": exported.path, "bytes": Path(exported.path).stat().st_size}
    Path(os.environ["GPU_CHECK_OUT"], f"report-{trainer.rank}.json").write_text(json.dumps(report))


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model build_model returned, under torch.compile's wrapper if any."""
    return getattr(model, "_orig_mod", model)


if __name__ == "__main__":
    main()
