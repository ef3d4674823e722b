"""When to allreduce gradients on CPUs: during backward, each as it is produced (Horovod's
DistributedOptimizer, `grad_allreduce: overlap`), against after backward, all in one grouped allreduce
(hvdazure.torch.gradients, `grad_allreduce: after_backward`, the CPU default), on the ranks of one job:

    PYTHONPATH=. hvdazure run -np 2 --gloo|--mpi benchmarks/grad_allreduce_cost.py [--model mlp|cnn]
        [--pairs 12 --steps 30]

The same model (hvdazure bench's mlp or cnn, hvdazure/bench/models.py), weights, data and SGD for both, one
thread a rank. Paired blocks of `--steps` steps (after one warm-up pair), the order within a pair
alternated so that the load of a shared machine hits both alike; a block's time is the slowest rank's.
Reported (rank 0, and benchmarks/results/grad_allreduce_cost-MODEL-CONTROLLER.json): per-step milliseconds
of each (median, min, max over the pairs), and the per-pair ratio after_backward / overlap: its median with
a bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import horovod.torch as hvd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

from hvdazure.bench import stats
from hvdazure.bench.models import MODELS
from hvdazure.bench.models_torch import build_model, sgd
from hvdazure.torch.gradients import GradientsAfterBackward

RESULTS = Path(__file__).resolve().parent / "results"


def block_seconds_per_step(net: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           allreduce: Callable[[], None] | None, steps: int, x: torch.Tensor,
                           y: torch.Tensor) -> float:
    """Per-step seconds of `steps` training steps, the slowest rank's."""
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        if allreduce is not None:
            allreduce()
        optimizer.step()
    mine = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    return float(hvd.allgather(mine, name="bench.block").max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    shape, classes, batch = MODELS[args.model]
    generator = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(batch, *shape, generator=generator)
    y = torch.randint(0, classes, (batch,), generator=generator)
    overlapped = build_model(args.model)
    after = copy.deepcopy(overlapped)
    optimizers = {
        "overlap": hvd.DistributedOptimizer(sgd(overlapped.parameters()),
                                            named_parameters=list(overlapped.named_parameters())),
        "after_backward": sgd(after.parameters())}
    runs = {"overlap": (overlapped, None),
            "after_backward": (after, GradientsAfterBackward(after.parameters(), "average", "none", 1.0))}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for pair in range(args.pairs + 1):  # pair 0 warms up
        order = list(runs) if pair % 2 else list(runs)[::-1]
        for name in order:
            net, allreduce = runs[name]
            seconds = block_seconds_per_step(net, optimizers[name], allreduce, args.steps, x, y)
            if pair:
                times[name].append(seconds)
    if hvd.rank() != 0:
        return
    ratios = [a / o for a, o in zip(times["after_backward"], times["overlap"], strict=True)]
    controller = "gloo" if hvd.gloo_enabled() else "mpi"
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": f"hvdazure run -np {hvd.size()} --{controller} benchmarks/grad_allreduce_cost.py --model "
                   f"{args.model} --pairs {args.pairs} --steps {args.steps}",
        "world_size": hvd.size(), "controller": controller, "model": args.model, "batch_per_rank": batch,
        "ms_per_step": {name: {"median": statistics.median(v) * 1e3, "min": min(v) * 1e3, "max": max(v) * 1e3}
                        for name, v in times.items()},
        "ratio_after_backward_to_overlap": {"median": statistics.median(ratios),
                                            "ci95": list(stats.bootstrap_interval(ratios)),
                                            "min": min(ratios), "max": max(ratios)},
    }
    ms, ratio = result["ms_per_step"], result["ratio_after_backward_to_overlap"]
    print(f"{args.model}, {controller}: overlap {ms['overlap']['median']:.2f} ms/step, after_backward "
          f"{ms['after_backward']['median']:.2f} ms/step; ratio {ratio['median']:.3f} (95% interval "
          f"{ratio['ci95'][0]:.3f}-{ratio['ci95'][1]:.3f}) over {args.pairs} pairs")
    write_result(RESULTS / f"grad_allreduce_cost-{args.model}-{controller}.json", result)


if __name__ == "__main__":
    main()
