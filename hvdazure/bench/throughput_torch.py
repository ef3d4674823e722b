"""The PyTorch side of the throughput benchmark (a ThroughputSide): models_torch.py's synthetic data and
models through TorchTrainer with BatchTimer, which times batches of steps after a warm-up
(throughput_workload.py).
Imported in ranks only.
"""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from torch.utils.data import Dataset

from hvdazure import Callback, TrainConfig
from hvdazure.bench.models_torch import SyntheticData, build_model, sgd
from hvdazure.bench.throughput_workload import BatchSchedule, BatchTimer, train_config
from hvdazure.torch import TorchTrainer


class SyntheticTrainer(TorchTrainer):
    def __init__(self, config: TrainConfig, model: str, length: int, timer: Callback) -> None:
        super().__init__(config, callbacks=[timer])
        self.model_name, self.length = model, length

    def build_model(self) -> torch.nn.Module:
        return build_model(self.model_name)

    def build_optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return sgd(params, lr)

    def train_dataset(self) -> Dataset:
        return SyntheticData(self.model_name, self.length)

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
