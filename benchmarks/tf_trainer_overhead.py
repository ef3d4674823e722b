"""TensorFlowTrainer's step time against a hand-written horovod.tensorflow loop, and TF against PyTorch.

    .venv/bin/hvdazure run -np 2 benchmarks/tf_trainer_overhead.py [--repeats 5] [--epochs 2] [--quick]

The TensorFlow counterpart of trainer_overhead.py: the same MLP (256-512-512-10), the same data (that
benchmark's tensors), batch and world size. The hand-written loop is what Horovod's TensorFlow 2 examples
show, on Keras 3: a tf.function step with a GradientTape wrapped in hvd.DistributedGradientTape (one grouped
allreduce: `groups=1`; Keras 3 variables have no `.ref()`, so the tape differentiates with respect to their
backing tf.Variables, `v.value`), model and optimizer variables broadcast from rank 0 once built, a sharded,
shuffled, prefetched tf.data pipeline, the loss averaged across ranks every `log_every` steps. Unless
`--no-torch`, trainer_overhead.py's hand-written horovod.torch loop runs in the same job too, for TF's step
time against PyTorch's on the same model.

The variants alternate in one job, so machine noise hits them alike. Every step is timed from the end of the
previous one (data loading, loop and callbacks included; setup excluded; the first step includes tracing).
Reported: the median over all steps of each variant, each run's median, and the ratios per run (their spread
is the measurement's noise). All variants use one intra-op and one inter-op thread per rank (the torch
benchmark uses one torch thread). Rank 0 prints a table and writes JSON. Target: TensorFlowTrainer's time
per step within 2% of the hand loop (<= 1.02). Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
import trainer_overhead as torch_bench  # the PyTorch benchmark's model, data and hand-written loop
from common import StepClock, write_result

from hvdazure import TrainConfig
from hvdazure.tensorflow import TensorFlowTrainer

TF_HAND, TF_TRAINER, TORCH_HAND = "TF hand-written", "TensorFlowTrainer", "torch hand-written"


def arrays() -> tuple:
    """trainer_overhead.py's data, as NumPy arrays."""
    x, y = torch_bench.dataset().tensors
    return x.numpy(), y.numpy()


def model() -> keras.Model:
    keras.utils.set_random_seed(0)
    f, h, c = torch_bench.FEATURES, torch_bench.HIDDEN, torch_bench.CLASSES
    return keras.Sequential([keras.Input((f,)), keras.layers.Dense(h, activation="relu"),
                             keras.layers.Dense(h, activation="relu"), keras.layers.Dense(c)])


def loss_of(net: keras.Model, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return keras.losses.sparse_categorical_crossentropy(y, net(x, training=True), from_logits=True)


def tf_hand_written(epochs: int, batch_size: int, lr: float, log_every: int) -> list[float]:
    """Horovod's TensorFlow 2 example loop on Keras 3. Returns the wall time of every step."""
    x, y = arrays()
    data = (tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
            .shuffle(len(x) // hvd.size(), seed=0, reshuffle_each_iteration=True)
            .batch(batch_size).prefetch(tf.data.AUTOTUNE))
    net = model()
    optimizer = keras.optimizers.SGD(learning_rate=lr * hvd.size())
    optimizer.build(net.trainable_variables)
    # Keras 3 variables have no .ref() (Horovod issue #4290): Horovod gets the backing tf.Variables.
    hvd.broadcast_variables([v.value for v in [*net.variables, *optimizer.variables]], root_rank=0)
    backing = [v.value for v in net.trainable_variables]

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_of(net, xb, yb))
        gradients = hvd.DistributedGradientTape(tape, groups=1).gradient(loss, backing)
        optimizer.apply_gradients(zip(gradients, net.trainable_variables, strict=True))
        return loss

    steps, durations = 0, []
    for _ in range(epochs):
        mark = time.perf_counter()
        for xb, yb in data:
            loss = step(xb, yb)
            steps += 1
            if steps % log_every == 0:
                hvd.allreduce(loss, name="loss").numpy()
            now = time.perf_counter()
            durations.append(now - mark)
            mark = now
    return durations


class BenchTrainer(TensorFlowTrainer):
    def build_model(self):
        return model()

    def build_optimizer(self, lr):
        return keras.optimizers.SGD(learning_rate=lr)

    def train_dataset(self):
        return arrays()

    def training_step(self, net, batch):
        x, y = batch
        return loss_of(net, x, y)


def with_trainer(epochs: int, batch_size: int, lr: float, log_every: int) -> list[float]:
    clock = StepClock()
    trainer = BenchTrainer(TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, log_every=log_every,
                                       progress_bar=False), callbacks=[clock])
    trainer.fit()
    return clock.durations


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternated runs of every variant")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="a check that it runs: 2 repeats of 1 epoch (64 steps per run on 2 ranks)")
    parser.add_argument("--no-torch", action="store_true", help="leave out the PyTorch hand-written loop")
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "tf_trainer_overhead.json"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.epochs = 2, 1
    # One thread each, before TensorFlow's first operation fixes them (the trainer's own setting then
    # changes nothing), as the torch benchmark does with torch.set_num_threads(1): 2 ranks on 2 cores.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    variants = {TF_HAND: tf_hand_written, TF_TRAINER: with_trainer}
    if not args.no_torch:
        # horovod.torch beside horovod.tensorflow in one process: each has its own Gloo context, and one
        # rank's starting while the other's first is still connecting can fail ("Connection refused").
        hvd.allreduce(tf.constant(0.0), name="before_torch_init").numpy()
        torch_bench.hvd.init()
        torch_bench.hvd.allreduce(torch_bench.torch.zeros(1), name="after_torch_init")
        torch_bench.torch.set_num_threads(1)
        variants[TORCH_HAND] = torch_bench.hand_written
    common = (args.epochs, args.batch_size, 0.01, args.log_every)
    steps: dict[str, list[float]] = {name: [] for name in variants}
    per_run: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # alternating, so machine noise hits every variant alike
        for name, run in variants.items():
            durations = [d * 1e3 for d in run(*common)]
            steps[name] += durations
            per_run[name].append(statistics.median(durations))
    if hvd.rank() != 0:
        return 0
    median = {name: statistics.median(values) for name, values in steps.items()}
    comparisons = [(TF_TRAINER, TF_HAND)] + ([(TF_HAND, TORCH_HAND)] if TORCH_HAND in variants else [])
    ratios = {}
    print(f"{'variant':<20}{'ms/step (median)':>18}  per-run medians")
    for name, values in per_run.items():
        print(f"{name:<20}{median[name]:>18.3f}  " + "  ".join(f"{v:.3f}" for v in values))
    for a, b in comparisons:
        run_ratios = [x / y for x, y in zip(per_run[a], per_run[b], strict=True)]
        ratios[f"{a} / {b}"] = {"all_steps": median[a] / median[b], "per_run": run_ratios,
                                **{f"per_run_{k}": v for k, v in spread(run_ratios).items()}}
        s = spread(run_ratios)
        print(f"ratio {a} / {b}: {median[a] / median[b]:.3f} over all steps; per run "
              f"median {s['median']:.3f}, {s['min']:.3f} to {s['max']:.3f}")
    print(f"target: {TF_TRAINER} / {TF_HAND} <= 1.02")
    write_result(args.json, {
        "benchmark": "tf_trainer_overhead",
        "quick": args.quick,
        "world_size": hvd.size(),
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "steps_per_run": len(steps[TF_HAND]) // args.repeats,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                     **({"torch": torch_bench.torch.__version__} if TORCH_HAND in variants else {})},
        "per_run_median_ms": per_run,
        "median_ms_per_step": median,
        "ratios": ratios,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
