"""The PyTorch side of the overhead benchmark (an OverheadSide): the model, the data, Horovod's hand-written
loop and the same training through TorchTrainer, each timed over one block of steps (setup excluded), the
workload as overhead_workload.py sets it. Imported in ranks only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hvdazure import TrainConfig
from hvdazure.bench.overhead_workload import (
    CLASSES,
    FEATURES,
    HAND,
    HIDDEN,
    LOG_EVERY,
    LR,
    TRAINER,
    UNTIMED,
    BlockTime,
    InStepTimer,
    StepClock,
    time_after_first_step,
)
from hvdazure.torch import TorchTrainer

SAMPLES = 8192


def dataset(samples: int = SAMPLES) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, FEATURES, generator=g),
                         torch.randint(0, CLASSES, (samples,), generator=g))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def hand_written(epochs: int, batch_size: int, lr: float = LR, log_every: int = LOG_EVERY,
                 data: TensorDataset | None = None) -> list[float]:
    """Horovod's example loop (DistributedSampler + set_epoch, DistributedOptimizer, broadcasts, the loss
    averaged across ranks every `log_every` steps). Returns the wall time of every step (data included)."""
    data = data if data is not None else dataset()
    net = model()
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=lr * hvd.size()),
                                         named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    steps, durations = 0, []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        net.train()
        mark = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % log_every == 0:
                hvd.allreduce(loss.detach(), name="loss").item()
            now = time.perf_counter()
            durations.append(now - mark)
            mark = now
    return durations


class BenchTrainer(TorchTrainer, InStepTimer):
    """The same model, data and optimizer as the hand-written loop; times its run_step, so that what
    the loop does around the step (its bookkeeping) is the rest of the step's time."""

    def __init__(self, config: TrainConfig, data: TensorDataset, clock: StepClock) -> None:
        super().__init__(config, callbacks=[clock])
        self.data = data

    def build_model(self) -> torch.nn.Module:
        return model()

    def build_optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self) -> TensorDataset:
        return self.data

    def training_step(self, net: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(net(x), y)


def with_trainer(epochs: int, batch_size: int, lr: float = LR, log_every: int = LOG_EVERY,
                 data: TensorDataset | None = None,
                 step_times: bool = True) -> tuple[list[float], list[float]]:
    """The same training through TorchTrainer: every step's wall time, and the time of each inside
    its backend's run_step."""
    clock = StepClock()
    trainer = BenchTrainer(TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, log_every=log_every,
                                       progress_bar=False, step_times=step_times),
                           data if data is not None else dataset(), clock)
    trainer.fit()
    return clock.durations, trainer.in_step_s


def block_runners(steps: int, batch_size: int) -> dict[str, Callable[[], BlockTime]]:
    """A block of `steps` steps of each variant on data of exactly one epoch: its time after the first step
    (and the trainer's outside its step)."""
    hvd.init()
    if "OMP_NUM_THREADS" not in os.environ:  # the trainer's own setting, for both variants
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // hvd.local_size()))
    data = dataset(steps * batch_size * hvd.size())
    return {HAND: lambda: time_after_first_step(hand_written(1, batch_size, data=data)),
            TRAINER: lambda: time_after_first_step(*with_trainer(1, batch_size, data=data)),
            UNTIMED: lambda: time_after_first_step(*with_trainer(1, batch_size, data=data, step_times=False))}


def slowest_rank(seconds: float) -> float:
    """The slowest rank's time for a block (the ranks wait for each other every step anyway)."""
    return float(hvd.allreduce(torch.tensor(seconds, dtype=torch.float64), op=hvd.Max, name="bench.block"))


def rank() -> int:
    return hvd.rank()


def world_size() -> int:
    return hvd.size()
