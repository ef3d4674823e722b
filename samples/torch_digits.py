"""Train an MLP on scikit-learn's bundled digits (8x8 images, 10 classes; no download) with hvdazure.

    hvdazure run -np 2 samples/torch_digits.py                 # 2 local ranks (Gloo)
    hvdazure run -np 2 --mpi samples/torch_digits.py --set epochs=20
    mpirun -np 2 python samples/torch_digits.py   |   horovodrun -np 2 python samples/torch_digits.py
    python samples/torch_digits.py                             # 1 process
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from hvdazure import TrainConfig
from hvdazure.torch import TorchTrainer


def digits_split(seed: int = 0, eval_fraction: float = 0.2) -> tuple[TensorDataset, TensorDataset]:
    """The same train/eval split on every rank: a fixed permutation of the 1797 images."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_eval = int(len(x) * eval_fraction)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[eval_idx], y[eval_idx])


class DigitsTrainer(TorchTrainer):
    def build_model(self) -> torch.nn.Module:
        hidden = self.config.extra.get("hidden", 128)
        return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    def train_dataset(self):
        return digits_split()[0]

    def eval_dataset(self):
        return digits_split()[1]

    def training_step(self, model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, y),
                "accuracy": (logits.argmax(dim=1) == y).float().mean()}

    def validation_step(self, model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, y),
                "accuracy": (logits.argmax(dim=1) == y).float().mean()}


if __name__ == "__main__":
    config = TrainConfig.from_cli(epochs=15, batch_size=32, lr=0.05, warmup_epochs=1, schedule="cosine",
                                  log_every=10)
    trainer = DigitsTrainer(config)
    final = trainer.fit()[-1]  # the history is identical on every rank; rank 0 reports it
    if trainer.is_main:
        print(f"final: eval accuracy {final['eval_accuracy']:.4f}, eval loss {final['eval_loss']:.4f}, "
              f"train loss {final['train_loss']:.4f}", flush=True)
