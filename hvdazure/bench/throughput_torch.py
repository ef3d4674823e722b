"""The PyTorch side of the throughput benchmark (a ThroughputSide): synthetic data, the models and
TorchTrainer with BatchTimer, which times batches of steps after a warm-up (throughput_workload.py).
Imported in ranks only.
"""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from torch.utils.data import Dataset

from hvdazure import TrainConfig
from hvdazure.bench.throughput_workload import (
    CNN_WIDTH,
    DISTINCT_SAMPLES,
    MODELS,
    MOMENTUM,
    BatchSchedule,
    BatchTimer,
    train_config,
)
from hvdazure.torch import TorchTrainer


class SyntheticData(Dataset):
    """`length` samples cycling through a few fixed random ones (as Horovod's synthetic benchmark, which
    trains on one random batch): no memory for a dataset, no time spent making data during the steps."""

    def __init__(self, length: int, shape: tuple[int, ...], classes: int,
                 distinct: int = DISTINCT_SAMPLES) -> None:
        g = torch.Generator().manual_seed(0)
        self.length = length
        self.x = torch.randn(distinct, *shape, generator=g)
        self.y = torch.randint(0, classes, (distinct,), generator=g)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index % len(self.x)], self.y[index % len(self.y)]


def build_model(name: str) -> torch.nn.Module:
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None)
    nn, w = torch.nn, CNN_WIDTH  # about 70 ms a step on one CPU core at batch 64
    return nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4 * w, MODELS["cnn"].classes))


class SyntheticTrainer(TorchTrainer):
    def __init__(self, config: TrainConfig, model: str, length: int, timer: BatchTimer) -> None:
        super().__init__(config, callbacks=[timer])
        self.model_name, self.length = model, length

    def build_model(self) -> torch.nn.Module:
        return build_model(self.model_name)

    def build_optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)

    def train_dataset(self) -> Dataset:
        side, classes, _ = MODELS[self.model_name]
        return SyntheticData(self.length, (3, side, side), classes)

    def training_step(self, net: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(net(x), y)


def rates_per_rank(model: str, batch_size: int, schedule: BatchSchedule,
                   ) -> tuple[list[list[float]] | None, int]:
    """Train on synthetic data through TorchTrainer; every rank's samples/s per timed batch (on rank 0,
    None elsewhere) and the world size."""
    timer = BatchTimer(schedule.warmup, schedule.steps_per_batch, batch_size,
                       synchronize=torch.cuda.synchronize if torch.cuda.is_available() else None)
    hvd.init()
    trainer = SyntheticTrainer(train_config(batch_size, schedule), model,
                               schedule.steps * batch_size * hvd.size(), timer)
    trainer.fit()
    rates = hvd.allgather_object(timer.rates, name="bench.rates")
    return (rates if hvd.rank() == 0 else None), hvd.size()
