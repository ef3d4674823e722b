"""TorchTrainer's step time against a hand-written Horovod loop: same model, data, batch and world size.

    .venv/bin/hvdazure run -np 2 benchmarks/trainer_overhead.py [--repeats 3] [--epochs 2]

Both variants run in the same job, alternating, so machine noise hits both alike. The hand-written loop is
what Horovod's examples show (DistributedSampler + set_epoch, DistributedOptimizer, broadcasts, the loss
averaged across ranks every `log_every` steps). Every step is timed from the end of the previous one (data
loading, loop and callbacks included; setup excluded) and the medians over all steps are compared. Rank 0
prints a table and writes JSON. Target: the trainer's time per step within 2% of the hand loop (<= 1.02).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from common import StepClock, write_result
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hvdazure import TrainConfig
from hvdazure.torch import TorchTrainer

FEATURES, HIDDEN, CLASSES, SAMPLES = 256, 512, 10, 8192


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(SAMPLES, FEATURES, generator=g), torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    )


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


def hand_written(epochs: int, batch_size: int, lr: float, log_every: int) -> list[float]:
    """Horovod's example loop. Returns the wall time of every step (data loading included)."""
    data = dataset()
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


class BenchTrainer(TorchTrainer):
    def build_model(self):
        return model()

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self):
        return dataset()

    def training_step(self, net, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(net(x), y)


def with_trainer(epochs: int, batch_size: int, lr: float, log_every: int) -> list[float]:
    clock = StepClock()
    trainer = BenchTrainer(TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, log_every=log_every,
                                       progress_bar=False), callbacks=[clock])
    trainer.fit()
    return clock.durations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "trainer_overhead.json"
    )
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)  # both variants alike; 2 ranks on 2 cores
    common = (args.epochs, args.batch_size, 0.01, args.log_every)
    steps: dict[str, list[float]] = {"hand-written": [], "TorchTrainer": []}
    per_run: dict[str, list[float]] = {"hand-written": [], "TorchTrainer": []}
    for _ in range(args.repeats):  # alternating, so machine noise hits both alike
        for name, run in (("hand-written", hand_written), ("TorchTrainer", with_trainer)):
            durations = [d * 1e3 for d in run(*common)]
            steps[name] += durations
            per_run[name].append(statistics.median(durations))
    # the median over every step of every run: robust to the bursts of a shared 2-core machine
    hand, ours = statistics.median(steps["hand-written"]), statistics.median(steps["TorchTrainer"])
    if hvd.rank() == 0:
        print(f"{'variant':<14}{'ms/step (median)':>18}  per-run medians")
        for name, values in per_run.items():
            runs = "  ".join(f"{v:.3f}" for v in values)
            print(f"{name:<14}{statistics.median(steps[name]):>18.3f}  {runs}")
        print(f"ratio TorchTrainer / hand-written: {ours / hand:.3f} (target <= 1.02)")
        result = {
            "benchmark": "trainer_overhead",
            "world_size": hvd.size(),
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "repeats": args.repeats,
            "per_run_median_ms": per_run,
            "median_ms_per_step": {"hand-written": hand, "TorchTrainer": ours},
            "ratio": ours / hand,
        }
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
