"""Checkpoint cost: hvdazure's atomic, verified save/load of a ~100 MB model against bare torch.save/load,
and the step-time stall a periodic checkpoint causes in training.

    .venv/bin/hvdazure run -np 2 benchmarks/checkpoint_io.py [--mb 100] [--repeats 5]

Part 1 runs on rank 0 alone (as saving does): the same state (model + optimizer) written by
CheckpointManager (temporary directory, sha256 while writing, fsync, rename, `latest`) and by a bare
torch.save to one file, with and without an fsync; then read back (hvdazure verifies every checksum).
Part 2 trains on all ranks with a checkpoint every few steps and compares those steps with the others.
Rank 0 prints tables and writes JSON. Targets: save ratio <= 1.2 against bare torch.save.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from common import StepClock, write_result
from torch.utils.data import TensorDataset

from hvdazure import TrainConfig
from hvdazure.core.checkpoint import CheckpointManager
from hvdazure.torch import TorchTrainer


def big_model(mb: int) -> torch.nn.Module:
    side = int((mb * 2**20 / 4) ** 0.5)
    return torch.nn.Linear(side, side, bias=False)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def save_load(mb: int, repeats: int, root: Path) -> dict[str, list[float]]:
    model = big_model(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = CheckpointManager(str(root / "managed"), keep_last=1)
    bare = root / "bare.pt"
    writers = {"model.pt": lambda f: torch.save(model.state_dict(), f),
               "optimizer.pt": lambda f: torch.save(optimizer.state_dict(), f)}

    def bare_save(fsync: bool) -> None:
        with open(bare, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    def managed_load() -> None:
        _, files, _ = manager.read_latest_valid()  # what a resume does: each file read and hashed once
        torch.load(io.BytesIO(files["model.pt"]), weights_only=True)
        torch.load(io.BytesIO(files["optimizer.pt"]), weights_only=True)

    times: dict[str, list[float]] = {k: [] for k in ("bare save", "bare save + fsync", "hvdazure save",
                                                     "bare load", "hvdazure load")}
    for step in range(repeats):  # interleaved, so noise hits all variants alike
        times["bare save"].append(timed(lambda: bare_save(False)))
        times["bare save + fsync"].append(timed(lambda: bare_save(True)))
        times["hvdazure save"].append(timed(lambda s=step: manager.save(s, writers, {})))
        times["bare load"].append(timed(lambda: torch.load(bare, weights_only=True)))
        times["hvdazure load"].append(timed(managed_load))
    return times


class StallTrainer(TorchTrainer):
    def build_model(self):
        return big_model(self.config.extra["mb"])

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self):
        side = big_model(self.config.extra["mb"]).in_features
        return TensorDataset(torch.randn(64 * 40, side))

    def training_step(self, model, batch):
        (x,) = batch
        return model(x).pow(2).mean()


def stall(mb: int, every: int, root: Path) -> dict[str, float]:
    timer = StepClock()
    config = TrainConfig(epochs=1, batch_size=32, lr=1e-6, progress_bar=False, log_every=1000,
                         checkpoint_dir=str(root / "stall"), checkpoint_every_steps=every,
                         checkpoint_every_epochs=None, keep_last=1, extra={"mb": mb})
    trainer = StallTrainer(config, callbacks=[timer])
    trainer.fit()
    saving = [d for i, d in enumerate(timer.durations, 1) if i % every == 0]
    plain = [d for i, d in enumerate(timer.durations, 1) if i % every != 0]
    return {"steps": len(timer.durations), "every_steps": every,
            "median_step_s": statistics.median(plain), "median_checkpoint_step_s": statistics.median(saving),
            "stall_s": statistics.median(saving) - statistics.median(plain)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "checkpoint_io.json")
    args = parser.parse_args()
    hvd.init()
    with tempfile.TemporaryDirectory(dir=os.environ.get("HVDAZURE_BENCH_DIR")) as tmp:
        result: dict = {"benchmark": "checkpoint_io", "model_mb": args.mb, "world_size": hvd.size()}
        if hvd.rank() == 0:
            times = save_load(args.mb, args.repeats, Path(tmp))
            medians = {k: statistics.median(v) for k, v in times.items()}
            result.update(raw_s=times, median_s=medians,
                          save_ratio=medians["hvdazure save"] / medians["bare save"],
                          save_ratio_vs_fsync=medians["hvdazure save"] / medians["bare save + fsync"],
                          load_ratio=medians["hvdazure load"] / medians["bare load"])
        shared = Path(tmp) if hvd.rank() == 0 else Path(tempfile.mkdtemp())
        result["stall"] = stall(args.mb, args.every, shared)
    if hvd.rank() == 0:
        print(f"{'operation (' + str(args.mb) + ' MB model)':<28}{'median s':>10}")
        for name, value in result["median_s"].items():
            print(f"{name:<28}{value:>10.3f}")
        print(f"save ratio hvdazure / bare torch.save: {result['save_ratio']:.2f} (target <= 1.2); "
              f"against torch.save + fsync: {result['save_ratio_vs_fsync']:.2f}")
        print(f"load ratio hvdazure / bare torch.load: {result['load_ratio']:.2f}")
        s = result["stall"]
        print(f"training, {hvd.size()} ranks, checkpoint every {s['every_steps']} steps: step "
              f"{s['median_step_s'] * 1e3:.1f} ms, checkpoint step "
              f"{s['median_checkpoint_step_s'] * 1e3:.1f} ms, stall {s['stall_s'] * 1e3:.1f} ms")
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
