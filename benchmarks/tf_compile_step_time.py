"""What `compile: true` (XLA's jit_compile of the forward and backward pass) changes per optimizer step of
TensorFlowTrainer on the CPU: the throughput benchmark's models (hvdazure/bench/models_tf.py: `mlp` and the
small `cnn` on 32x32 images), synthetic data, batch 64 per rank, SGD with momentum, on the ranks of one job:

    PYTHONPATH=. hvdazure run -np 1|2 [--gloo|--mpi] benchmarks/tf_compile_step_time.py [--model mlp|cnn]
        [--pairs 5 --steps 30]

The TensorFlow twin of compile_step_time.py: paired blocks, each one fit() of `--steps` steps, the order
within a pair alternated so that the load of a shared machine hits both alike; the first pair warms up (the
compiled block's first step waits for XLA: reported apart, not counted). A block's time is the slowest
rank's mean over its steps after the first. Reported (rank 0, a table and
benchmarks/results/tf_compile_step_time_MODEL_npN.json): per-step milliseconds of each variant (median, min,
max over the pairs), the per-pair ratio compiled / eager (median, min, max), and the first step of each.
"eager" is the binding's usual step, a tf.function without XLA.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compiled_vs_eager, print_compiled_vs_eager, write_result

from hvdazure import Callback, TrainConfig
from hvdazure.bench.models_tf import build_model, sgd, synthetic_arrays
from hvdazure.tensorflow import TensorFlowTrainer

RESULTS = Path(__file__).resolve().parent / "results"
BATCH_SIZE = 64


class StepClock(Callback):
    """The time at the end of every step, and at the start of the first."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_start(self, trainer: TensorFlowTrainer) -> None:
        self.times = [time.perf_counter()]

    def on_step_end(self, trainer: TensorFlowTrainer) -> None:
        self.times.append(time.perf_counter())


class BenchTrainer(TensorFlowTrainer):
    def __init__(self, config: TrainConfig, data: tuple[np.ndarray, np.ndarray], clock: StepClock) -> None:
        super().__init__(config, callbacks=[clock])
        self.data = data

    def build_model(self) -> keras.Model:
        return build_model(self.config.extra["model"])

    def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer:
        return sgd(lr)

    def train_dataset(self) -> tuple[np.ndarray, np.ndarray]:
        return self.data

    def training_step(self, model: keras.Model, batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        x, y = batch
        return keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)


def block(compiled: bool, model: str, data: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """One fit() of one epoch of `data`: (the slowest rank's seconds per step after the first, its first
    step's seconds)."""
    clock = StepClock()
    config = TrainConfig(epochs=1, batch_size=BATCH_SIZE, log_every=1000, progress_bar=False,
                         step_times=False, sanity_check=False, compile=compiled, extra={"model": model})
    BenchTrainer(config, data, clock).fit()
    durations = np.diff(clock.times)
    mine = tf.constant([[durations[1:].mean(), durations[0]]], tf.float64)
    slowest = tf.reduce_max(hvd.allgather(mine, name="bench.block"), axis=0).numpy()
    return float(slowest[0]), float(slowest[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    hvd.init()
    logging.getLogger("hvdazure").addFilter(lambda record: record.levelno >= logging.WARNING)
    x, y = synthetic_arrays(args.model, BATCH_SIZE)
    copies = args.steps * hvd.size()
    data = (np.concatenate([x] * copies), np.concatenate([y] * copies))
    pairs = compiled_vs_eager(lambda compiled: block(compiled, args.model, data), args.pairs,
                              hvd.rank() == 0)
    if hvd.rank() != 0:
        return
    controller = "gloo" if hvd.gloo_enabled() else "mpi"
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"hvdazure run -np {hvd.size()} --{controller} benchmarks/tf_compile_step_time.py "
                   f"--model {args.model} --pairs {args.pairs} --steps {args.steps}",
        "tensorflow": tf.__version__, "world_size": hvd.size(), "controller": controller,
        "model": f"{args.model} (hvdazure/bench/models_tf.py), float32, CPU",
        "batch_per_rank": BATCH_SIZE, "load_average": os.getloadavg(),
        **pairs,
    }
    print_compiled_vs_eager(result)
    write_result(RESULTS / f"tf_compile_step_time_{args.model}_np{hvd.size()}.json", result)


if __name__ == "__main__":
    main()
