"""The benchmarks' models and synthetic data in PyTorch (models.py describes them). Imports torch and
torchvision (for resnet50) only: every peer of `hvdazure bench peers` trains exactly these, Horovod or not."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils.data import Dataset

from hvdazure.bench.models import CNN_WIDTH, DISTINCT_SAMPLES, LR, MLP_WIDTHS, MODELS, MOMENTUM


class SyntheticData(Dataset):
    """`length` samples cycling through a few fixed random ones (as Horovod's synthetic benchmark, which
    trains on one random batch): no memory for a dataset, no time spent making data during the steps."""

    def __init__(self, model: str, length: int, distinct: int = DISTINCT_SAMPLES) -> None:
        shape, classes, _ = MODELS[model]
        g = torch.Generator().manual_seed(0)
        self.length = length
        self.x = torch.randn(distinct, *shape, generator=g)
        self.y = torch.randint(0, classes, (distinct,), generator=g)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index % len(self.x)], self.y[index % len(self.y)]


def build_model(name: str) -> torch.nn.Module:
    """The model called `name` in models.MODELS, seeded alike on every rank and in every peer."""
    torch.manual_seed(0)
    nn, (shape, classes, _) = torch.nn, MODELS[name]
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None, num_classes=classes)
    if name == "mlp":
        widths = (shape[0], *MLP_WIDTHS)
        hidden = [layer for a, b in itertools.pairwise(widths) for layer in (nn.Linear(a, b), nn.ReLU())]
        return nn.Sequential(*hidden, nn.Linear(widths[-1], classes))
    w = CNN_WIDTH
    return nn.Sequential(nn.Conv2d(shape[0], w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4 * w, classes))


def sgd(params: Any, lr: float = LR) -> torch.optim.Optimizer:
    """The benchmarks' optimizer: SGD with momentum."""
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
