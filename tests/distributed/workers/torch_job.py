"""A small, exactly reproducible TorchTrainer job: linear regression in float64 on synthetic data.

Configured through TrainConfig's CLI (`--set batch_size=4 --set extra.n_train=37 ...`). Each rank reports
its final parameters, the history, the sample indices it trained on per epoch (in order), and the LR of
every optimizer step, for the tests to compare across ranks and runs.

extra: n_train, n_eval, features, stop_rank + stop_step (that rank alone asks to stop after that step),
       warn (every rank warns at every step), step_sleep (seconds per step, to make a job slow enough to
       interrupt), big_mb (a large buffer in the model, to make checkpoints slow to write),
       catch_checkpoint_errors (fit() in a try, as a notebook would: each rank that gets a CheckpointError
       reports its message and lives on until every rank has reported, or for 20 s, then exits 0),
       batchnorm (a Linear-BatchNorm1d-Linear model), extra_metric_rank (that rank alone also reports a
       metric "extra" = 7), nonfinite_empty (training_step returns an infinite loss if it is ever called
       for an empty micro-batch, as a stand-in sample with a non-finite loss would).
Each rank writes pid-<rank> into HVDAZURE_TEST_OUT when training starts.

Several trainings in one job (one launch, as `hvdazure sweep` runs its trials): `torch_job.py --runs
RUNS.json` (workers/_report.py `main`).
"""

import hashlib
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _report import main, report_rank, step_times
from squatter import squatting
from torch.utils.data import Dataset

from hvdazure import Callback, TrainConfig
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.torch import TorchTrainer


class Regression(Dataset):
    def __init__(self, n: int, features: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = torch.tensor(rng.normal(size=(n, features)), dtype=torch.float64)
        w = torch.tensor(rng.normal(size=(features, 1)), dtype=torch.float64)
        self.y = self.x @ w + 0.1 * torch.tensor(rng.normal(size=(n, 1)), dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return torch.tensor(i), self.x[i], self.y[i]


class Recorder(Callback):
    """Records the LR the optimizer actually used at each step, and stops on one rank if asked."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_start(self, trainer) -> None:
        (Path(os.environ["HVDAZURE_TEST_OUT"]) / f"pid-{trainer.rank}").write_text(str(os.getpid()))

    def on_step_end(self, trainer) -> None:
        time.sleep(trainer.config.extra.get("step_sleep", 0))
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])
        extra = trainer.config.extra
        if trainer.rank == extra.get("stop_rank") and trainer.state.step == extra.get("stop_step"):
            trainer.state.request_stop(f"rank {trainer.rank} asked at step {trainer.state.step}")


class RegressionTrainer(TorchTrainer):
    def __init__(self, config: TrainConfig, callbacks=()) -> None:
        self.recorder = Recorder()
        super().__init__(config, callbacks=[self.recorder, *callbacks])
        self.seen: dict[int, list[int]] = {}
        self.training_step_calls = 0

    def build_model(self):
        features = self.config.extra.get("features", 3)
        if self.config.extra.get("batchnorm"):
            return torch.nn.Sequential(torch.nn.Linear(features, 4, dtype=torch.float64),
                                       torch.nn.BatchNorm1d(4, dtype=torch.float64),
                                       torch.nn.Linear(4, 1, dtype=torch.float64))
        model = torch.nn.Linear(features, 1, dtype=torch.float64)
        if self.config.extra.get("big_mb"):
            model.register_buffer("ballast", torch.rand(self.config.extra["big_mb"] * 2**20 // 4))
        return model

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self):
        extra = self.config.extra
        return Regression(extra.get("n_train", 37), extra.get("features", 3), seed=1)

    def eval_dataset(self):
        n_eval = self.config.extra.get("n_eval")
        return Regression(n_eval, self.config.extra.get("features", 3), seed=2) if n_eval else None

    def training_step(self, model, batch):
        index, x, y = batch
        if self.config.extra.get("warn"):
            warnings.warn("a warning raised on every rank", UserWarning, stacklevel=1)
        self.training_step_calls += 1
        if not self.micro_batch.is_empty:
            self.seen.setdefault(self.state.epoch, []).extend(index.tolist())
        loss = torch.nn.functional.mse_loss(model(x), y)
        if self.micro_batch.is_empty and self.config.extra.get("nonfinite_empty"):
            loss = loss * float("inf")
        if self.rank == self.config.extra.get("extra_metric_rank"):
            return {"loss": loss, "extra": torch.tensor(7.0)}
        return loss

    def validation_step(self, model, batch):
        index, x, y = batch
        return {"mse": torch.nn.functional.mse_loss(model(x), y), "index": index.double().mean()}


def report_checkpoint_error_and_linger(trainer: RegressionTrainer, error: CheckpointError) -> None:
    """Report the error, then stay alive (as user code that caught it would) until every rank reported:
    a rank left waiting in a collective by this one would wait as long."""
    report_rank(trainer.rank, {"checkpoint_error": str(error)})
    out = Path(os.environ["HVDAZURE_TEST_OUT"])
    deadline = time.monotonic() + 20
    while len(list(out.glob("rank-*.json"))) < trainer.world_size and time.monotonic() < deadline:
        time.sleep(0.1)


def train_and_report(argv: list[str] | None = None) -> None:
    """One training configured by `argv` (`--set ...`), reported into HVDAZURE_TEST_OUT."""
    config = TrainConfig.from_cli(argv, log_every=1, progress_bar=False)
    trainer = (squatting(RegressionTrainer) if config.extra.get("squat") else RegressionTrainer)(config)
    try:
        history = trainer.fit()
    except CheckpointError as exc:
        if not trainer.config.extra.get("catch_checkpoint_errors"):
            raise
        report_checkpoint_error_and_linger(trainer, exc)
        raise SystemExit(0) from None
    params = [p.detach().flatten().tolist() for p in trainer.model.parameters()]
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in trainer.model.parameters()))
    report_rank(trainer.rank, {
        "world_size": trainer.world_size,
        "params": params,
        "params_sha256": digest.hexdigest(),
        "history": history,
        "squat_intact": trainer.squat_intact() if config.extra.get("squat") else None,
        "seen": {str(k): v for k, v in trainer.seen.items()},
        "lrs": trainer.recorder.lrs,
        "steps_per_epoch": trainer.steps_per_epoch,
        "stop_reason": trainer.state.stop_reason,
        "training_step_calls": trainer.training_step_calls,
        "batchnorm_batches": [int(m.num_batches_tracked) for m in trainer.model.modules()
                              if isinstance(m, torch.nn.BatchNorm1d)],
        "tensorflow_imported": "tensorflow" in sys.modules,
        "step_times": step_times(trainer),
    })


if __name__ == "__main__":
    main(train_and_report)
