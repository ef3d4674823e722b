"""What watching for a non-finite loss costs per optimizer step (config field on_nan_loss, core/nonfinite.py):
TorchTrainer on the overhead benchmark's MLP, its record of non-finite steps kept (on: the default) against
the same steps with the record's per-step work replaced by nothing (off), in one fit() of one process:

    PYTHONPATH=. .venv/bin/python benchmarks/nonfinite_check_cost.py [--pairs 10 --steps 50 --batch 64]

Paired blocks of `--steps` steps (after one warm-up pair), the order within a pair alternated so that the
load of a shared machine hits both alike; on a GPU each block ends with a synchronisation (none inside).
The metrics and the record are reduced once per block in both (log_every = steps). Reported, and written
to benchmarks/results/nonfinite_check_cost.json: per-step milliseconds of each variant (median, min, max over
the pairs) and the per-pair ratio on / off (median, bootstrap 95% interval, min, max).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

from hvdazure import Callback, TrainConfig
from hvdazure.bench.overhead_workload import CLASSES, FEATURES, HIDDEN
from hvdazure.bench.stats import bootstrap_interval
from hvdazure.torch import TorchTrainer
from hvdazure.torch import backend as torch_backend

RECORD = torch_backend._NonFiniteRecord
REAL = {"loss": RECORD.loss, "gradients": RECORD.gradients, "probe": torch_backend.nonfinite_probe}


def watch(on: bool) -> None:
    """The record's per-step work as it is (on), or nothing in its place (off)."""
    if on:
        RECORD.loss, RECORD.gradients = REAL["loss"], REAL["gradients"]  # type: ignore[method-assign]
        torch_backend.nonfinite_probe = REAL["probe"]
        return
    RECORD.loss = RECORD.gradients = lambda *args, **kwargs: None  # type: ignore[method-assign]
    torch_backend.nonfinite_probe = lambda tensors: 0.0


class Blocks(Callback):
    """Times blocks of `steps` steps, switching the watch at each block's start as `plan` says."""

    def __init__(self, steps: int, plan: list[bool], cuda: bool) -> None:
        self.steps, self.plan, self.cuda = steps, plan, cuda
        self.times: list[float] = []
        self._start = 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def on_step_begin(self, trainer) -> None:
        done = trainer.state.step
        if done % self.steps == 0 and done // self.steps < len(self.plan):
            self._sync()
            watch(self.plan[done // self.steps])
            self._start = time.perf_counter()

    def on_step_end(self, trainer) -> None:
        if trainer.state.step % self.steps == 0:
            self._sync()
            self.times.append(time.perf_counter() - self._start)


class MLP(TorchTrainer):
    def build_model(self):
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                   torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                   torch.nn.Linear(HIDDEN, CLASSES))

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    def train_dataset(self):
        n = self.config.extra["samples"]
        g = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(n, FEATURES, generator=g),
                             torch.randint(0, CLASSES, (n,), generator=g))

    def training_step(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    plan = [flag for pair in range(args.pairs + 1) for flag in ((True, False) if pair % 2 else (False, True))]
    cuda = torch.cuda.is_available()
    blocks = Blocks(args.steps, plan, cuda)
    config = TrainConfig(batch_size=args.batch, lr=0.01, log_every=args.steps, progress_bar=False,
                         step_times=False, extra={"samples": args.batch * args.steps * len(plan)})
    MLP(config, callbacks=[blocks]).fit()
    watch(True)
    per_step = [t / args.steps * 1e3 for t in blocks.times[2:]]  # the warm-up pair left out
    on = [t for t, flag in zip(per_step, plan[2:], strict=True) if flag]
    off = [t for t, flag in zip(per_step, plan[2:], strict=True) if not flag]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    low, high = bootstrap_interval(ratios)
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "pairs": args.pairs, "steps": args.steps, "batch": args.batch,
        "ms_per_step": {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                        for name, v in (("on", on), ("off", off))},
        "ratio_on_off": {"median": statistics.median(ratios), "ci95": [low, high], "min": min(ratios),
                         "max": max(ratios)},
    }
    for name in ("on", "off"):
        figures = result["ms_per_step"][name]
        print(f"{name:>3}: {figures['median']:.3f} ms/step (min {figures['min']:.3f}, "
              f"max {figures['max']:.3f})")
    r = result["ratio_on_off"]
    print(f"on/off: {r['median']:.4f} (95% {low:.4f}-{high:.4f}; min {r['min']:.4f}, max {r['max']:.4f})")
    write_result(Path(__file__).resolve().parent / "results" / "nonfinite_check_cost.json", result)


if __name__ == "__main__":
    main()
