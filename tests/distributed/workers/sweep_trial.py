"""A user's training script, unmodified for sweeps: linear regression in float64 on fixed synthetic data.

Each run writes, into its config's output_dir, `rank-<group rank>.json`: its world rank (MPI), its Horovod
rank and size, its final parameters, start and end times, and its config, for the sweep tests.

extra: behaviour: "ok"; "raise" (group rank 1, or 0 alone, raises in its second epoch's first step while its
peer is in a collective); "nan" (the loss becomes NaN in epoch 2). step_sleep: seconds per step. n_train.
hold_file: while that file exists, every trial but the first to start trains at a second a step, so a test
can stop a sweep knowing one trial has finished and another is inside fit() (no race with its last step).
"""

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from hvdazure import Callback, TrainConfig
from hvdazure.torch import TorchTrainer


def regression(n: int) -> TensorDataset:
    rng = np.random.default_rng(7)
    x = torch.tensor(rng.normal(size=(n, 4)), dtype=torch.float64)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64)
    return TensorDataset(x, x @ w + 0.1 * torch.tensor(rng.normal(size=(n, 1)), dtype=torch.float64))


class Sleep(Callback):
    def __init__(self) -> None:
        self.held = False

    def on_train_start(self, trainer) -> None:
        hold = trainer.config.extra.get("hold_file")
        if hold and os.path.exists(hold):
            try:  # the first trial to start claims the right to finish; the others are held
                os.close(os.open(f"{hold}.first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                self.held = True

    def on_step_end(self, trainer) -> None:
        time.sleep(trainer.config.extra.get("step_sleep", 0))
        hold = trainer.config.extra.get("hold_file")
        if self.held and hold and os.path.exists(hold):
            time.sleep(1.0)


class SweptRegression(TorchTrainer):
    def build_model(self):
        return torch.nn.Linear(4, 1).double()

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self):
        return regression(self.config.extra.get("n_train", 64))

    def eval_dataset(self):
        return regression(32)

    def training_step(self, model, batch):
        x, y = batch
        behaviour = self.config.extra.get("behaviour", "ok")
        if self.state.epoch == 1 and behaviour == "raise" and self.rank == min(1, self.world_size - 1):
            raise ValueError(f"trial asked to fail on rank {self.rank}")
        loss = torch.nn.functional.mse_loss(model(x), y)
        if self.state.epoch >= 1 and behaviour == "nan":
            loss = loss * math.nan
        return loss

    def validation_step(self, model, batch):
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(model(x), y)}


if __name__ == "__main__":
    started = time.time()
    config = TrainConfig.from_cli(epochs=3, batch_size=4, lr=0.05, log_every=4)
    trainer = SweptRegression(config, callbacks=[Sleep()])
    history = trainer.fit()
    params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).tolist()
    out = Path(trainer.config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{trainer.rank}.json").write_text(json.dumps({
        "world_rank": int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1")), "rank": trainer.rank,
        "size": trainer.world_size, "params": params, "start": started, "end": time.time(),
        "config": trainer.config.to_dict(), "history": history}))
