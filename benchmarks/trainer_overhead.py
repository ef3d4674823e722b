"""TorchTrainer's step time against a hand-written Horovod loop: same model, data, batch and world size.

    .venv/bin/hvdazure run -np 2 benchmarks/trainer_overhead.py [--repeats 3] [--epochs 2]

Both variants run in the same job, alternating, so machine noise hits both alike. The hand-written loop is
what Horovod's examples show (DistributedSampler + set_epoch, DistributedOptimizer, broadcasts, the loss
averaged across ranks every `log_every` steps). Time is measured from the first to the last step of
training, data loading included, setup excluded. Rank 0 prints a table and writes JSON. Target: the
trainer's time per step within 2% of the hand loop (ratio <= 1.02).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hvdazure import Callback, TrainConfig
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


def hand_written(epochs: int, batch_size: int, lr: float, log_every: int) -> tuple[float, int]:
    """Horovod's example loop. Returns (seconds from first to last step, steps)."""
    data = dataset()
    net = model()
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=lr * hvd.size()), named_parameters=net.named_parameters()
    )
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    steps, start = 0, time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        net.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % log_every == 0:
                hvd.allreduce(loss.detach(), name="loss").item()
    return time.perf_counter() - start, steps


class Stopwatch(Callback):
    def on_train_start(self, trainer) -> None:
        self.start = time.perf_counter()

    def on_train_end(self, trainer) -> None:
        self.seconds = time.perf_counter() - self.start


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


def with_trainer(epochs: int, batch_size: int, lr: float, log_every: int) -> tuple[float, int]:
    watch = Stopwatch()
    trainer = BenchTrainer(
        TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, log_every=log_every, progress_bar=False),
        callbacks=[watch],
    )
    trainer.fit()
    return watch.seconds, trainer.state.step


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
    per_step: dict[str, list[float]] = {"hand-written": [], "TorchTrainer": []}
    for _ in range(args.repeats):
        for name, run in (("hand-written", hand_written), ("TorchTrainer", with_trainer)):
            seconds, steps = run(*common)
            per_step[name].append(seconds / steps * 1e3)
    hand, ours = statistics.median(per_step["hand-written"]), statistics.median(per_step["TorchTrainer"])
    if hvd.rank() == 0:
        print(f"{'variant':<14}{'ms/step (median)':>18}{'runs':>30}")
        for name, values in per_step.items():
            print(f"{name:<14}{statistics.median(values):>18.3f}  {'  '.join(f'{v:.3f}' for v in values)}")
        print(f"ratio TorchTrainer / hand-written: {ours / hand:.3f} (target <= 1.02)")
        result = {
            "benchmark": "trainer_overhead",
            "world_size": hvd.size(),
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "repeats": args.repeats,
            "ms_per_step": per_step,
            "median_ms_per_step": {"hand-written": hand, "TorchTrainer": ours},
            "ratio": ours / hand,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
