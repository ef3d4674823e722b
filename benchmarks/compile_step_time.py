"""What `compile: true` (torch.compile) changes per optimizer step on the CPU: the overhead benchmark's
workload (hvdazure/bench/overhead_torch.py: an MLP 256-512-512-10, batch 64 per rank, SGD) trained by
TorchTrainer eager and compiled, on the ranks of one job:

    PYTHONPATH=. hvdazure run -np 2 --gloo|--mpi benchmarks/compile_step_time.py [--pairs 10 --steps 30]
        [--mode default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs]

Paired blocks, each one fit() of `--steps` steps (one epoch of data), the order within a pair alternated so
that the load of a shared machine hits both alike; the first pair warms up (the compiled block's first step
waits for the compiler: reported apart, not counted). A block's time is the slowest rank's over its steps
after the first, data loading and callbacks included. Reported (rank 0, a table and
benchmarks/results/compile_step_time.json): per-step milliseconds of each variant (median, min, max over
the pairs), the per-pair ratio compiled / eager (median, min, max), and the first step of the first block of
each (the compile). No verdict: what compiling buys depends on the model and the device.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import horovod.torch as hvd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compiled_vs_eager, print_compiled_vs_eager, write_result

from hvdazure import TrainConfig
from hvdazure.bench.overhead_torch import BenchTrainer, dataset
from hvdazure.bench.overhead_workload import BATCH_SIZE, FEATURES, HIDDEN, LOG_EVERY, LR, StepClock

RESULT = Path(__file__).resolve().parent / "results" / "compile_step_time.json"


def block(compiled: bool, mode: str, data: torch.utils.data.Dataset) -> tuple[float, float]:
    """One fit() of one epoch of `data`: (the slowest rank's seconds per step after the first, its first
    step's seconds)."""
    clock = StepClock()
    config = TrainConfig(epochs=1, batch_size=BATCH_SIZE, lr=LR, log_every=LOG_EVERY, progress_bar=False,
                         compile=compiled, compile_mode=mode)
    BenchTrainer(config, data, clock).fit()
    mine = torch.tensor([sum(clock.durations[1:]) / (len(clock.durations) - 1), clock.durations[0]],
                        dtype=torch.float64)
    slowest = hvd.allgather(mine.unsqueeze(0), name="bench.block").max(dim=0).values
    return float(slowest[0]), float(slowest[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--mode", default="default")
    args = parser.parse_args()
    hvd.init()
    logging.getLogger("hvdazure").addFilter(lambda record: record.levelno >= logging.WARNING)  # 22 fit()s
    if "OMP_NUM_THREADS" not in os.environ:  # the trainer's own setting, set before the first block too
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // hvd.local_size()))
    data = dataset(args.steps * BATCH_SIZE * hvd.size())
    pairs = compiled_vs_eager(lambda compiled: block(compiled, args.mode, data), args.pairs, hvd.rank() == 0)
    if hvd.rank() != 0:
        return
    controller = "gloo" if hvd.gloo_enabled() else "mpi"
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"hvdazure run -np {hvd.size()} --{controller} benchmarks/compile_step_time.py "
                   f"--pairs {args.pairs} --steps {args.steps} --mode {args.mode}",
        "torch": torch.__version__, "world_size": hvd.size(), "controller": controller,
        "model": f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-10, float32, CPU, {torch.get_num_threads()} thread(s) "
                 "a rank",
        "batch_per_rank": BATCH_SIZE, "compile_mode": args.mode, "load_average": os.getloadavg(),
        **pairs,
    }
    print_compiled_vs_eager(result)
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
