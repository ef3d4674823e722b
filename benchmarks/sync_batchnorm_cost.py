"""What `sync_batchnorm: true` costs per optimizer step: an MLP with BatchNorm layers, plain against
synchronized (hvdazure.torch.SyncBatchNorm: one allgather per layer in the forward pass, one allreduce in the
backward), the same weights, data and Horovod DistributedOptimizer, on the ranks of one job:

    PYTHONPATH=. hvdazure run -np 2 --gloo|--mpi benchmarks/sync_batchnorm_cost.py [--pairs 10 --steps 30]

Paired blocks of `--steps` steps (after one warm-up pair), the order within a pair alternated so that the
load of a shared machine hits both alike. A block's time is the slowest rank's. Reported (rank 0, and
benchmarks/results/sync_batchnorm_cost.json): per-step milliseconds of each variant (median, min, max
over the pairs), and the per-pair ratio synchronized / plain (median, min, max).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import horovod.torch as hvd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

from hvdazure.torch import convert_sync_batchnorm

RESULT = Path(__file__).resolve().parent / "results" / "sync_batchnorm_cost.json"
INPUTS, HIDDEN, CLASSES = 256, (512, 512), 10  # each hidden layer Linear-BatchNorm1d-ReLU
BATCH = 64  # per rank


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    width = INPUTS
    for hidden in HIDDEN:
        layers += [torch.nn.Linear(width, hidden), torch.nn.BatchNorm1d(hidden), torch.nn.ReLU()]
        width = hidden
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, CLASSES))


def block_seconds_per_step(net: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int,
                           x: torch.Tensor, y: torch.Tensor) -> float:
    """Per-step seconds of `steps` training steps, the slowest rank's."""
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    mine = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    return float(hvd.allgather(mine, name="bench.block").max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(BATCH, INPUTS, generator=generator)
    y = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    plain = model()
    variants = {"plain": plain, "synchronized": convert_sync_batchnorm(copy.deepcopy(plain))}
    optimizers = {name: hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                                                 named_parameters=[(f"{name}.{n}", p)
                                                                   for n, p in net.named_parameters()])
                  for name, net in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for pair in range(args.pairs + 1):  # pair 0 warms up
        order = list(variants) if pair % 2 else list(variants)[::-1]
        for name in order:
            seconds = block_seconds_per_step(variants[name], optimizers[name], args.steps, x, y)
            if pair:
                times[name].append(seconds)
    if hvd.rank() != 0:
        return
    ratios = [s / p for s, p in zip(times["synchronized"], times["plain"], strict=True)]

    def spread(values: list[float], scale: float = 1.0) -> dict[str, float]:
        return {"median": statistics.median(values) * scale, "min": min(values) * scale,
                "max": max(values) * scale}

    controller = "gloo" if hvd.gloo_enabled() else "mpi"
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": f"hvdazure run -np {hvd.size()} --{controller} benchmarks/sync_batchnorm_cost.py "
                   f"--pairs {args.pairs} --steps {args.steps}",
        "world_size": hvd.size(), "controller": controller,
        "model": f"MLP {'-'.join(map(str, (INPUTS, *HIDDEN, CLASSES)))}, {len(HIDDEN)} BatchNorm1d layers, "
                 "float32, CPU, 1 thread a rank",
        "batch_per_rank": BATCH,
        "ms_per_step": {name: spread(values, 1e3) for name, values in times.items()},
        "ratio_synchronized_to_plain": spread(ratios),
    }
    ms, ratio = result["ms_per_step"], result["ratio_synchronized_to_plain"]
    print(f"plain {ms['plain']['median']:.2f} ms/step, synchronized {ms['synchronized']['median']:.2f} "
          f"ms/step; ratio {ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f}) over "
          f"{args.pairs} pairs")
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
